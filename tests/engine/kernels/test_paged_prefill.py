"""paged_prefill_attention against the engine's eager attention over a flat mixed batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.kernels import paged_prefill_attention
from engine.kernels.reference import paged_prefill_reference
from tests.engine.kernels.paged_cases import ATTENTION_TOLERANCES, make_paged_cache, random_tensor

# (new tokens, context after this step): fresh prompts, chunks after earlier context (crossing
# block boundaries), decode rows, and a chunk longer than one query tile.
MIXED = [(5, 5), (4, 17), (1, 1), (1, 33), (17, 17), (16, 40)]


def run_case(cases: list[tuple[int, int]], num_heads: int, num_kv_heads: int, head_dim: int,
             block_size: int, dtype: torch.dtype, device: torch.device, seed: int = 0, block_m: int = 16,
             block_n: int = 16, index_dtype: torch.dtype = torch.int64, give_max_len: bool = True) -> None:
    query_lens = [q for q, _ in cases]
    seq_lens = [s for _, s in cases]
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, dtype, device, seed, index_dtype)
    starts = torch.tensor([0, *query_lens], dtype=index_dtype).cumsum(0).to(index_dtype)
    query = random_tensor((sum(query_lens), num_heads, head_dim), dtype, device, seed + 1)  # [T, H, D]
    scale = head_dim**-0.5
    out = paged_prefill_attention(
        query, cache.k_cache, cache.v_cache, cache.block_tables, starts.to(device), cache.seq_lens, scale,
        max_query_len=max(query_lens) if give_max_len else None, block_m=block_m, block_n=block_n,
    )
    expected = paged_prefill_reference(query.cpu().float(), cache.clean_k.float(), cache.clean_v.float(),
                                       cache.block_tables.cpu(), starts, cache.seq_lens.cpu(), scale)
    assert out.shape == query.shape and out.dtype == dtype
    torch.testing.assert_close(out.cpu(), expected.to(dtype), **ATTENTION_TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(("block_size", "head_dim"), [(4, 16), (16, 32)])
def test_matches_reference(device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int) -> None:
    run_case(MIXED, num_heads=4, num_kv_heads=2, head_dim=head_dim, block_size=block_size, dtype=dtype,
             device=device)


def test_default_tiles_and_grid(device: torch.device) -> None:
    # 64-wide tiles, and the grid sized from T because max_query_len is not given.
    run_case(MIXED, 4, 2, head_dim=16, block_size=16, dtype=torch.float32, device=device, block_m=64,
             block_n=64, give_max_len=False)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (4, 1), (9, 3)])
def test_gqa_groups(device: torch.device, num_heads: int, num_kv_heads: int) -> None:
    run_case([(6, 6), (3, 21)], num_heads, num_kv_heads, head_dim=16, block_size=4, dtype=torch.float32,
             device=device)


def test_int32_metadata(device: torch.device) -> None:
    run_case(MIXED[:3], 4, 2, head_dim=16, block_size=4, dtype=torch.float32, device=device,
             index_dtype=torch.int32)


def test_strided_query_from_fused_qkv(device: torch.device) -> None:
    num_heads, num_kv_heads, head_dim = 4, 2, 16
    query_lens, seq_lens = [3, 5], [7, 5]
    cache = make_paged_cache(seq_lens, 4, num_kv_heads, head_dim, torch.float32, device, seed=2)
    qkv = random_tensor((8, num_heads + 2 * num_kv_heads, head_dim), torch.float32, device, 3)
    query = qkv[:, :num_heads]  # [T, H, D] view
    starts = torch.tensor([0, 3, 8])
    out = paged_prefill_attention(query, cache.k_cache, cache.v_cache, cache.block_tables, starts.to(device),
                                  cache.seq_lens, 0.25, max_query_len=max(query_lens))
    expected = paged_prefill_reference(query.cpu(), cache.clean_k, cache.clean_v, cache.block_tables.cpu(),
                                       starts, cache.seq_lens.cpu(), 0.25)
    torch.testing.assert_close(out.cpu(), expected, **ATTENTION_TOLERANCES[torch.float32])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cases=st.lists(
        st.tuples(st.integers(1, 20), st.integers(0, 20)).map(lambda qc: (qc[0], qc[0] + qc[1])),
        min_size=1, max_size=3,
    ),
    block_size=st.sampled_from([1, 4, 16]),
    num_kv_heads=st.integers(1, 2),
    group=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(device: torch.device, cases: list[tuple[int, int]], block_size: int, num_kv_heads: int,
                       group: int, seed: int) -> None:
    run_case(cases, num_kv_heads * group, num_kv_heads, head_dim=16, block_size=block_size,
             dtype=torch.float32, device=device, seed=seed)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"query_start_loc": torch.tensor([0, 8])}, "query_start_loc must have shape"),
    ({"query_start_loc": torch.tensor([0.0, 3.0, 8.0])}, "query_start_loc must be one of"),
    ({"seq_lens": torch.tensor([7, 5, 1])}, "block_tables has 2 rows, seq_lens 3"),
    ({"block_m": 8}, "block_m must be a power of two >= 16"),
    ({"block_n": 48}, "block_n must be a power of two >= 16"),
    ({"max_query_len": 9}, "max_query_len must be in"),
    ({"query": torch.zeros(8, 4, 16, dtype=torch.bfloat16)}, "must share a dtype"),
    ({"v_cache": torch.zeros(3, 4, 2, 16)}, "v_cache must have shape"),
])
def test_bad_inputs_raise(device: torch.device, overrides: dict[str, object], message: str) -> None:
    cache = make_paged_cache([7, 5], 4, 2, 16, torch.float32, device, seed=0)
    args: dict[str, object] = {
        "query": torch.zeros(8, 4, 16),
        "k_cache": cache.k_cache,
        "v_cache": cache.v_cache,
        "block_tables": cache.block_tables,
        "query_start_loc": torch.tensor([0, 3, 8]),
        "seq_lens": cache.seq_lens,
        "scale": 0.25,
    }
    args.update(overrides)
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    with pytest.raises(ValueError, match=message):
        paged_prefill_attention(**args)  # type: ignore[arg-type]
