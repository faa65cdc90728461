"""Execution paths agree: eager vs optimized (fused projections), torch vs Triton attention.

The Triton backend runs here through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
on machines without CUDA, before anything imports the kernels); on a GPU it runs compiled.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.weights import load_model

PROMPTS = [[5, 6, 7], [100] * 20, [300, 2, 9, 9] * 5, [1] * 37]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return load_model("dummy:tiny")


def test_optimized_and_eager_give_the_same_tokens(tiny) -> None:
    eager = LLM("dummy:tiny", loaded=tiny, execution="eager").generate(PROMPTS, GREEDY)
    optimized = LLM("dummy:tiny", loaded=tiny, execution="optimized").generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in eager] == [o.token_ids for o in optimized]


def test_eager_projections_are_fused_dense_linears(tiny) -> None:
    layer = LLM("dummy:tiny", loaded=tiny, execution="eager").engine.runner.model.model.layers[0]
    config = tiny.config
    assert layer.self_attn.qkv_proj.kind == "dense"
    assert layer.self_attn.qkv_proj.weight.shape == ((config.num_heads + 2 * config.num_kv_heads) * config.head_dim,
                                                     config.hidden_size)
    assert layer.mlp.gate_up_proj.weight.shape == (2 * config.intermediate_size, config.hidden_size)


def test_triton_forward_matches_torch_forward(tiny) -> None:
    """Every Triton kernel in one forward (KV store, paged attention, fused add+RMSNorm, SiLU-and-mul)."""
    from engine.kernels import triton_available

    available, reason = triton_available()
    if not available:
        pytest.skip(f"Triton cannot run here: {reason}")
    torch_out = LLM("dummy:tiny", loaded=tiny, attention_backend="torch", max_num_batched_tokens=24,
                    block_size=8).generate(PROMPTS, GREEDY)
    triton_llm = LLM("dummy:tiny", loaded=tiny, attention_backend="triton", max_num_batched_tokens=24, block_size=8)
    ops = triton_llm.engine.runner.model.ops
    assert (ops.name, ops.attention.name) == ("triton", "triton")
    assert ops.rms_norm.__module__ == ops.add_rms_norm.__module__ == "engine.kernels.rmsnorm"
    assert ops.silu_and_mul.__module__ == "engine.kernels.silu_mul"
    triton_out = triton_llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in triton_out] == [o.token_ids for o in torch_out]


def test_triton_backend_refuses_clearly_when_unavailable(tiny) -> None:
    from engine.kernels import triton_available

    if triton_available()[0]:
        pytest.skip("Triton can run here; the refusal path is for machines without it")
    with pytest.raises(ValueError, match="attention_backend='triton' cannot run here"):
        LLM("dummy:tiny", loaded=tiny, attention_backend="triton")



@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_prepacked_projection_matches_dense_linear(dtype_name: str) -> None:
    import torch
    import torch.nn.functional as F

    from engine.model.projection import OneDnnPackedProjection, packed_or_dense

    dtype = getattr(torch, dtype_name)
    weight = torch.randn(48, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
    projection = packed_or_dense(weight)
    if not isinstance(projection, OneDnnPackedProjection):
        pytest.skip(f"this CPU or torch build has no oneDNN {dtype_name} GEMM; the dense fallback is in use")
    for rows in (1, 7, 16, 65):
        x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows)).to(dtype)
        if dtype == torch.bfloat16:
            assert torch.equal(projection(x), F.linear(x, weight))
        else:  # another summation order: equal to rounding, not bit for bit
            torch.testing.assert_close(projection(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_non_float_or_non_cpu_weights_stay_dense() -> None:
    import torch

    from engine.model.projection import DenseProjection, packed_or_dense

    assert isinstance(packed_or_dense(torch.randn(8, 4, dtype=torch.float64)), DenseProjection)
    assert isinstance(packed_or_dense(torch.randn(8, 4, device="meta")), DenseProjection)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_optimized_cpu_packs_and_reuses_buffers_and_gives_eager_tokens(tiny, dtype_name: str) -> None:
    import torch

    loaded = tiny if dtype_name == "float32" else load_model("dummy:tiny", torch.bfloat16)
    eager = LLM("dummy:tiny", loaded=loaded, dtype=dtype_name, execution="eager", device="cpu")
    optimized = LLM("dummy:tiny", loaded=loaded, dtype=dtype_name, execution="optimized", device="cpu")
    assert eager.engine.runner.gather_workspace is None
    assert optimized.engine.runner.gather_workspace is not None
    from engine.model.projection import native_bf16_gemm

    # NOTE: bfloat16 is packed only where oneDNN computes it natively (AVX512-BF16 or AMX); elsewhere it stays dense.
    packs = dtype_name == "float32" or native_bf16_gemm() is not None
    assert optimized.engine.runner.model.model.layers[0].mlp.down_proj.kind == ("onednn-packed" if packs else "dense")
    eager_out = eager.generate(PROMPTS, GREEDY)
    optimized_out = optimized.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in eager_out] == [o.token_ids for o in optimized_out]
