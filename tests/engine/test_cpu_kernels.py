"""The C decode-attention kernel of the CPU's optimized path, against the torch path it replaces.

The torch path (engine/attention.py) is the reference: gathered blocks, two batched matmuls, a
float32 softmax. Both are compared with a float64 run of that reference, so the kernel is held to
the same error the torch path makes, not to bit equality (it sums in another order).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import AttentionMetadata, paged_attention
from engine.cpu_kernels import cpu_kernels
from engine.cpu_kernels.build import build_library
from engine.weights import load_model

KERNELS, WHY = cpu_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason=f"the CPU kernels cannot be built here: {WHY}")


def _paged_batch(lens: list[int], query_lens: list[int], dtype: torch.dtype, num_heads: int = 9,
                 num_kv_heads: int = 3, head_dim: int = 64, block_size: int = 16, seed: int = 0):
    """Random caches and a batch whose sequences own scattered, non-adjacent blocks."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lens) * 2 + 1
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for n in lens:
        count = -(-n // block_size)
        tables.append(free[:count])
        free = free[count:]
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(dtype)
    meta = AttentionMetadata.build([0] * sum(query_lens), tables, query_lens, lens)
    return query, k_cache, v_cache, meta


@needs_kernels
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("lens", [[1], [5, 300, 17], [16, 32, 33, 900, 120, 7, 64, 250]])
@pytest.mark.parametrize("heads", [(9, 3, 64), (2, 1, 64), (4, 2, 128), (3, 1, 24)],
                         ids=["9-over-3", "2-over-1", "4-over-2-d128", "3-over-1-d24"])
def test_decode_kernel_matches_the_torch_path(dtype_name: str, lens: list[int], heads: tuple[int, int, int]) -> None:
    """On 2 threads a batch of 8 or more (sequence, head) pairs runs each pair in one pass, a smaller one in the
    chunked passes: 9 heads take the first way at every batch here, 2 heads the second until 8 sequences. Head
    sizes of 64 and 128 take the vector code where the CPU has it, 24 the plain loops."""
    dtype = getattr(torch, dtype_name)
    num_heads, num_kv_heads, head_dim = heads
    query, k_cache, v_cache, meta = _paged_batch(lens, [1] * len(lens), dtype, num_heads=num_heads,
                                                 num_kv_heads=num_kv_heads, head_dim=head_dim)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = KERNELS.paged_decode(query, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, 0.125)
    finally:
        torch.set_num_threads(threads)
    torch_path = paged_attention(query, k_cache, v_cache, meta, 0.125)
    exact = paged_attention(query.double(), k_cache.double(), v_cache.double(), meta, 0.125)
    assert got.dtype == dtype and got.shape == query.shape
    torch_error = (torch_path.double() - exact).abs().max().item()
    kernel_error = (got.double() - exact).abs().max().item()
    # Both round their intermediates alike (bfloat16 scores and weights in bfloat16), so the kernel is
    # held to the torch path's own error, give or take summation order.
    assert kernel_error <= max(torch_error, 1e-6 if dtype == torch.float32 else 0.0) * 1.5, \
        (kernel_error, torch_error)


@needs_kernels
def test_grouped_query_heads_read_their_own_kv_head() -> None:
    """Query head h reads KV head h // (H / KVH): zero every KV head but one and see which rows move."""
    query, k_cache, v_cache, meta = _paged_batch([40, 70], [1, 1], torch.float32, num_heads=6, num_kv_heads=2)
    v_cache[:, :, 0] = 0.0
    out = KERNELS.paged_decode(query, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, 0.125)
    assert out[:, :3].abs().max() == 0.0  # heads 0-2 read KV head 0, whose values are all zero
    assert out[:, 3:].abs().min() > 0.0


@needs_kernels
def test_mixed_batch_routes_decode_rows_to_the_kernel_and_prompt_chunks_to_torch() -> None:
    from engine.attention import TorchAttentionBackend

    query, k_cache, v_cache, meta = _paged_batch([50, 20, 130, 9], [1, 20, 1, 4], torch.float32)
    got = TorchAttentionBackend("cpu", KERNELS.decode_attention).attend(query, k_cache, v_cache, meta, 0.125)
    want = paged_attention(query, k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_kernel_refuses_what_it_cannot_read() -> None:
    query, k_cache, v_cache, meta = _paged_batch([10], [1], torch.float32)
    tables, lens = meta.decode_block_tables, meta.decode_seq_lens
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        KERNELS.paged_decode(query.half(), k_cache.half(), v_cache.half(), tables, lens, 0.125)
    with pytest.raises(ValueError, match="contiguous"):
        KERNELS.paged_decode(query.repeat(1, 1, 2)[:, :, :64], k_cache, v_cache, tables, lens, 0.125)
    with pytest.raises(TypeError, match="int64"):
        KERNELS.paged_decode(query, k_cache, v_cache, tables.int(), lens, 0.125)


def test_a_failed_build_says_why(tmp_path) -> None:
    compiler = tmp_path / "cc"
    compiler.write_text("#!/bin/sh\necho 'cc 1.0'\n[ \"$1\" = --version ] && exit 0\necho 'error: no AVX here' >&2\nexit 1\n")
    compiler.chmod(0o755)
    with pytest.raises(RuntimeError, match="failed: error: no AVX here"):
        build_library(str(compiler), tmp_path / "out")
    assert not list((tmp_path / "out").glob("*"))  # no library and no half-written file left behind


@pytest.fixture(scope="module")
def tiny():
    return load_model("dummy:tiny")


def test_backend_choice_per_path(tiny) -> None:
    optimized = LLM("dummy:tiny", loaded=tiny).engine.runner.ops.name
    assert optimized == ("cpu" if KERNELS is not None else "torch")
    assert LLM("dummy:tiny", loaded=tiny, execution="eager").engine.runner.ops.name == "torch"
    assert LLM("dummy:tiny", loaded=tiny, attention_backend="torch").engine.runner.ops.name == "torch"
    with pytest.raises(ValueError, match="attention_backend='cpu' cannot run here: dtype float16"):
        LLM("dummy:tiny", loaded=load_model("dummy:tiny", torch.float16), dtype="float16", attention_backend="cpu")


@needs_kernels
def test_engine_on_the_kernel_gives_the_torch_paths_tokens(tiny) -> None:
    prompts = [[5, 6, 7], [100] * 20, [300, 2, 9, 9] * 5, [1] * 37]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    torch_out = LLM("dummy:tiny", loaded=tiny, attention_backend="torch", block_size=8).generate(prompts, params)
    kernel_out = LLM("dummy:tiny", loaded=tiny, attention_backend="cpu", block_size=8).generate(prompts, params)
    assert [o.token_ids for o in kernel_out] == [o.token_ids for o in torch_out]


def test_every_kernel_source_and_header_ships_in_the_package() -> None:
    """A wheel (not only an editable install) carries what build_library compiles: package-data lists it."""
    import fnmatch
    import tomllib

    from engine.cpu_kernels.build import HEADERS, SOURCES

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    for path in (*SOURCES, *HEADERS):
        assert any(fnmatch.fnmatch(path.name, p) for p in patterns), f"{path.name} matches no package-data pattern"
