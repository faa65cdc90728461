"""The paged references themselves, checked against dense causal attention."""

from __future__ import annotations

import torch

from engine.attention import gather_context
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
