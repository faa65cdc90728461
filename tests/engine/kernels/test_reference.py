"""The paged references themselves, checked against dense causal attention."""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata, GatherWorkspace, gather_context, paged_attention
from engine.kernels.reference import dense_causal_attention, paged_decode_reference, paged_prefill_reference
from tests.engine.kernels.paged_cases import make_paged_cache, random_tensor

CPU = torch.device("cpu")


def dense_contexts(cache_k: torch.Tensor, cache_v: torch.Tensor, block_tables: torch.Tensor,
                   seq_lens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(gather_context(cache_k, block_tables[i], n), gather_context(cache_v, block_tables[i], n))
            for i, n in enumerate(seq_lens)]


def test_prefill_reference_matches_dense_attention() -> None:
    query_lens, seq_lens = [5, 4, 1, 17], [5, 17, 33, 40]
    cache = make_paged_cache(seq_lens, 4, 2, 16, torch.float64, CPU, seed=0)
    starts = torch.tensor([0, *query_lens]).cumsum(0)
    query = random_tensor((sum(query_lens), 6, 16), torch.float64, CPU, 1)  # [T, H, D], GQA group 3
    out = paged_prefill_reference(query, cache.clean_k, cache.clean_v, cache.block_tables, starts,
                                  cache.seq_lens, scale=0.25)
    contexts = dense_contexts(cache.clean_k, cache.clean_v, cache.block_tables, seq_lens)
    for i, (keys, values) in enumerate(contexts):
        rows = slice(int(starts[i]), int(starts[i + 1]))
        torch.testing.assert_close(out[rows], dense_causal_attention(query[rows], keys, values, 0.25))


def test_decode_reference_matches_dense_attention() -> None:
    seq_lens = [1, 5, 16, 17, 33]
    cache = make_paged_cache(seq_lens, 16, 1, 32, torch.float64, CPU, seed=2)
    query = random_tensor((len(seq_lens), 4, 32), torch.float64, CPU, 3)  # [B, H, D]
    out = paged_decode_reference(query, cache.clean_k, cache.clean_v, cache.block_tables, cache.seq_lens, 0.2)
    contexts = dense_contexts(cache.clean_k, cache.clean_v, cache.block_tables, seq_lens)
    for i, (keys, values) in enumerate(contexts):
        torch.testing.assert_close(out[i : i + 1], dense_causal_attention(query[i : i + 1], keys, values, 0.2))


def test_dense_attention_is_causal() -> None:
    # Changing a later key must leave every earlier query's output alone.
    query = random_tensor((4, 2, 16), torch.float64, CPU, 4)
    keys = random_tensor((6, 1, 16), torch.float64, CPU, 5)
    values = random_tensor((6, 1, 16), torch.float64, CPU, 6)
    before = dense_causal_attention(query, keys, values, 0.25)
    keys[5], values[5] = 10.0, 10.0  # position 5 is only visible to the last query (position 5)
    after = dense_causal_attention(query, keys, values, 0.25)
    torch.testing.assert_close(after[:3], before[:3])
    assert not torch.allclose(after[3], before[3])


def test_decode_with_a_reused_gather_workspace_matches_dense_attention() -> None:
    # The engine's own torch decode path, once allocating its gathers and once through the
    # workspace the optimized runner owns: a larger batch grows it, a smaller one reuses its memory.
    workspace = GatherWorkspace()
    for seed, seq_lens in enumerate(([3, 40, 17, 1], [9, 2])):
        cache = make_paged_cache(seq_lens, 8, 2, 16, torch.float64, CPU, seed=seed)
        query = random_tensor((len(seq_lens), 6, 16), torch.float64, CPU, 10 + seed)  # [B, H, D]
        meta = AttentionMetadata.build([0] * len(seq_lens), cache.block_tables.tolist(), [1] * len(seq_lens),
                                       seq_lens)
        plain = paged_attention(query, cache.clean_k, cache.clean_v, meta, 0.25)
        meta.workspace = workspace
        reused = paged_attention(query, cache.clean_k, cache.clean_v, meta, 0.25)
        assert torch.equal(reused, plain)
        contexts = dense_contexts(cache.clean_k, cache.clean_v, cache.block_tables, seq_lens)
        for i, (keys, values) in enumerate(contexts):
            torch.testing.assert_close(reused[i : i + 1], dense_causal_attention(query[i : i + 1], keys, values, 0.25))
        if seed == 0:
            first_keys, _ = workspace.gather(cache.clean_k, cache.clean_v, torch.tensor([0]))
    second_keys, _ = workspace.gather(cache.clean_k, cache.clean_v, torch.tensor([1]))
    assert second_keys.data_ptr() == first_keys.data_ptr()  # no new buffer for a smaller gather
