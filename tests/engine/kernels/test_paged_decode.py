"""paged_decode_attention against the engine's eager decode attention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.kernels import paged_decode_attention
from engine.kernels.reference import paged_decode_reference
from tests.engine.kernels.paged_cases import ATTENTION_TOLERANCES, make_paged_cache, random_tensor

# Lengths of 1, inside one block, exactly one block, one past a block, several blocks.
SEQ_LENS = [1, 5, 16, 17, 33]


def run_case(seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
             dtype: torch.dtype, device: torch.device, seed: int = 0, block_n: int = 64,
             index_dtype: torch.dtype = torch.int64) -> None:
    cache = make_paged_cache(seq_lens, block_size, num_kv_heads, head_dim, dtype, device, seed, index_dtype)
    query = random_tensor((len(seq_lens), num_heads, head_dim), dtype, device, seed + 1)  # [B, H, D]
    scale = head_dim**-0.5
    out = paged_decode_attention(query, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens,
                                 scale, block_n=block_n)
    expected = paged_decode_reference(query.cpu().float(), cache.clean_k.float(), cache.clean_v.float(),
                                      cache.block_tables.cpu(), cache.seq_lens.cpu(), scale)
    assert out.shape == query.shape and out.dtype == dtype and out.device == query.device
    torch.testing.assert_close(out.cpu(), expected.to(dtype), **ATTENTION_TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(("block_size", "head_dim", "block_n"), [(4, 16, 8), (16, 32, 16), (16, 64, 64)])
def test_matches_reference(device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int,
                           block_n: int) -> None:
    run_case(SEQ_LENS, num_heads=4, num_kv_heads=2, head_dim=head_dim, block_size=block_size, dtype=dtype,
             device=device, block_n=block_n)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (4, 1), (9, 3)])
def test_gqa_groups(device: torch.device, num_heads: int, num_kv_heads: int) -> None:
    run_case(SEQ_LENS, num_heads, num_kv_heads, head_dim=16, block_size=4, dtype=torch.float32, device=device,
             block_n=16)


def test_int32_tables_and_lengths(device: torch.device) -> None:
    run_case(SEQ_LENS, 4, 2, head_dim=16, block_size=4, dtype=torch.float32, device=device, block_n=16,
             index_dtype=torch.int32)


def test_block_size_need_not_be_a_power_of_two(device: torch.device) -> None:
    run_case([1, 7, 12], 4, 2, head_dim=16, block_size=6, dtype=torch.float32, device=device, block_n=8)


def test_strided_query_from_fused_qkv(device: torch.device) -> None:
    num_heads, num_kv_heads, head_dim = 4, 2, 16
    cache = make_paged_cache(SEQ_LENS, 4, num_kv_heads, head_dim, torch.float32, device, seed=3)
    qkv = random_tensor((len(SEQ_LENS), num_heads + 2 * num_kv_heads, head_dim), torch.float32, device, 4)
    query = qkv[:, :num_heads]  # [B, H, D] view, row stride (H + 2 KVH) * D
    out = paged_decode_attention(query, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.25)
    expected = paged_decode_reference(query.cpu(), cache.clean_k, cache.clean_v, cache.block_tables.cpu(),
                                      cache.seq_lens.cpu(), 0.25)
    torch.testing.assert_close(out.cpu(), expected, **ATTENTION_TOLERANCES[torch.float32])


def test_empty_context_gives_zeros(device: torch.device) -> None:
    # A padded CUDA-graph row has no context; it must not turn NaN.
    cache = make_paged_cache([0, 3], 4, 2, 16, torch.float32, device, seed=5)
    query = random_tensor((2, 4, 16), torch.float32, device, 6)
    out = paged_decode_attention(query, cache.k_cache, cache.v_cache, cache.block_tables, cache.seq_lens, 0.25)
    assert torch.equal(out[0].cpu(), torch.zeros(4, 16))
    assert torch.isfinite(out[1]).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seq_lens=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    block_size=st.sampled_from([1, 4, 8, 16]),
    num_kv_heads=st.integers(1, 2),
    group=st.integers(1, 3),
    head_dim=st.sampled_from([16, 32]),
    block_n=st.sampled_from([8, 16, 32]),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(device: torch.device, seq_lens: list[int], block_size: int, num_kv_heads: int,
                       group: int, head_dim: int, block_n: int, seed: int) -> None:
    run_case(seq_lens, num_kv_heads * group, num_kv_heads, head_dim, block_size, torch.float32, device,
             seed=seed, block_n=block_n)


def bad_call(device: torch.device, **overrides: object) -> None:
    cache = make_paged_cache([3, 5], 4, 2, 16, torch.float32, device, seed=0)
    args: dict[str, object] = {
        "query": random_tensor((2, 4, 16), torch.float32, device, 1),
        "k_cache": cache.k_cache,
        "v_cache": cache.v_cache,
        "block_tables": cache.block_tables,
        "seq_lens": cache.seq_lens,
        "scale": 0.25,
    }
    args.update(overrides)
    paged_decode_attention(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"query": torch.zeros(2, 4, 16, dtype=torch.int32)}, "query must be one of"),
    ({"query": torch.zeros(2, 4, 16, dtype=torch.float16)}, "must share a dtype"),
    ({"query": torch.zeros(2, 16)}, "query must have 3 dims"),
    ({"query": torch.zeros(2, 3, 16)}, "multiple of num_kv_heads"),
    ({"query": torch.zeros(2, 4, 8)}, "cache head_dim 16 != query head_dim 8"),
    ({"query": torch.zeros(2, 16, 4).transpose(1, 2)[:, :4]}, "must have 3 dims|contiguous in its last dim"),
    ({"block_tables": torch.zeros(3, 2, dtype=torch.int64)}, "block_tables has 3 rows"),
    ({"block_tables": torch.zeros(2, 2)}, "block_tables must be one of"),
    ({"seq_lens": torch.ones(3, dtype=torch.int32)}, "seq_lens must have shape"),
    ({"block_n": 12}, "block_n must be a power of two"),
    ({"seq_lens": torch.ones(2, dtype=torch.int32, device="meta")}, "all tensors must be on one device"),
])
def test_bad_inputs_raise(device: torch.device, overrides: dict[str, object], message: str) -> None:
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v
             for k, v in overrides.items()}
    with pytest.raises(ValueError, match=message):
        bad_call(device, **moved)


def test_head_dim_must_be_a_power_of_two(device: torch.device) -> None:
    cache = make_paged_cache([3], 4, 1, 24, torch.float32, device, seed=0)
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        paged_decode_attention(torch.zeros(1, 2, 24, device=device), cache.k_cache, cache.v_cache,
                               cache.block_tables, cache.seq_lens, 0.25)
