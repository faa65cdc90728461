"""Weight-only int8/int4 projections and bfloat16: the kernels, the GGUF's own codes, and HF as the oracle.

Exact where the arithmetic is exact (Q4_1 codes reproduce the file's dequantized weights bit for
bit; a quantized projection equals a float GEMM over its own dequantized weight to rounding), and
within stated tolerances where quantization changes the numbers (real-model logits against HF's
float32 forward on the same GGUF).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.model.projection import Int4Projection, Int8Projection, quantized_projection
from engine.model.quant import Int4Groups, int8_rows
from engine.weights import load_model
from tests.engine.hf_oracle import hf_greedy, hf_last_logits

GEN = torch.Generator().manual_seed(0)


def test_int4_groups_from_float_stay_within_half_a_step() -> None:
    weight = torch.randn(64, 96, generator=GEN)
    groups = Int4Groups.from_float(weight)
    assert groups.codes.dtype == torch.uint8 and int(groups.codes.max()) <= 15
    error = (groups.dequantize() - weight).abs().view(64, -1, 32)
    assert bool((error <= groups.scales.unsqueeze(-1) / 2 + 1e-6).all())


def test_int4_groups_refuse_rows_that_are_not_whole_groups() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        Int4Groups.from_float(torch.randn(8, 40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_projection_is_a_gemm_over_its_dequantized_weight(dtype: torch.dtype) -> None:
    groups = Int4Groups.from_float(torch.randn(128, 64, generator=GEN))
    projection = quantized_projection("int4", torch.empty(128, 64, dtype=dtype), groups)
    assert isinstance(projection, Int4Projection)
    x = torch.randn(5, 64, generator=GEN).to(dtype)
    expected = F.linear(x.float(), groups.dequantize())
    tol = 1e-4 if dtype == torch.float32 else 0.05 * float(expected.abs().max())
    torch.testing.assert_close(projection(x).float(), expected, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_projection_is_a_gemm_over_its_dequantized_weight(dtype: torch.dtype) -> None:
    weight = torch.randn(96, 64, generator=GEN)
    projection = quantized_projection("int8", weight.to(dtype))
    assert isinstance(projection, Int8Projection)
    codes, scales = int8_rows(weight.to(dtype))
    x = torch.randn(3, 64, generator=GEN).to(dtype)
    expected = F.linear(x.float(), codes.float() * scales.to(dtype).float().unsqueeze(1))
    tol = 1e-4 if dtype == torch.float32 else 0.05 * float(expected.abs().max())
    torch.testing.assert_close(projection(x).float(), expected, rtol=0, atol=tol)


def test_quantized_weights_refuse_a_non_cpu_device() -> None:
    with pytest.raises(ValueError, match="CPU kernels"):
        quantized_projection("int8", torch.empty(8, 32, device="meta"))


def test_quantized_engines_run_dummy_models_end_to_end() -> None:
    from engine.cpu_kernels import cpu_kernels

    tiny = load_model("dummy:tiny")
    prompts = [[5, 6, 7], [100] * 20]
    # int4 runs the C kernel where it builds (torch's int4 kernel otherwise); the head stays 8-bit either way
    suffix = "-kernel" if cpu_kernels()[0] is not None else ""
    for weights, want, want_head in (("int8", "int8", "int8"), ("int4", f"int4{suffix}", f"int8{suffix}")):
        llm = LLM("dummy:tiny", loaded=tiny, weights=weights, device="cpu")
        layer = llm.engine.runner.model.model.layers[0]
        assert layer.mlp.down_proj.kind == want
        assert llm.engine.runner.model.lm_head.kind == want_head
        outputs = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
        assert [len(o.token_ids) for o in outputs] == [6, 6]


def test_bad_weights_option_is_a_clear_error() -> None:
    from engine import EngineConfig

    with pytest.raises(ValueError, match="weights must be"):
        EngineConfig(weights="int3")  # type: ignore[arg-type]


# -- real weights ---------------------------------------------------------------------------------

@pytest.mark.real_model
def test_q4_1_codes_give_back_the_files_dequantized_weights(smollm2_loaded) -> None:
    """The int4 path reads the file's own codes: they reproduce the loader's float weights exactly."""
    sources = smollm2_loaded.int4_weights
    assert len(sources) == 7 * smollm2_loaded.config.num_layers  # every projection of every layer is Q4_1
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.7.mlp.down_proj.weight"):
        assert torch.equal(sources[name].groups().dequantize(), smollm2_loaded.state_dict[name])


# Stated tolerances against HF float32 on the same GGUF (measured margins are in docs/results.md): the top
# token of the last-position logits must agree on every prompt, and no logit may move by more than
# MAX_LOGIT_ERROR; greedy continuations must agree on their first MIN_SAME_TOKENS tokens.
QUANT_CASES = {
    "bfloat16": ({"dtype": "bfloat16"}, 1.5, 3),
    "int8": ({"weights": "int8"}, 1.5, 3),
    "int4": ({"weights": "int4"}, 1.0, 3),
    "bfloat16-int4": ({"dtype": "bfloat16", "weights": "int4"}, 1.5, 3),
}


# NOTE: quantized weights with float32 activations run torch's slow CPU path, the pairing docs/engine.md tells users
# never to pick; their checks run with the slow tests, the recommended pairings in the default run.
SLOW_CASES = {"int8", "int4"}


@pytest.mark.real_model
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in sorted(QUANT_CASES)])
def test_smollm2_quantized_and_bfloat16_stay_close_to_hf(smollm2_hf, smollm2_loaded, case: str) -> None:
    from tests.engine.test_oracle import REAL_PROMPTS, _engine_prefill_logits

    overrides, max_logit_error, min_same_tokens = QUANT_CASES[case]
    llm = LLM("smollm2-135m", loaded=smollm2_loaded, device="cpu", **overrides)
    prompt_ids = [llm.tokenizer.encode(p) for p in REAL_PROMPTS[:4]]
    for ids in prompt_ids:
        ours, theirs = _engine_prefill_logits(llm.engine, ids), hf_last_logits(smollm2_hf, ids)
        assert int(ours.argmax()) == int(theirs.argmax())
        assert float((ours - theirs).abs().max()) < max_logit_error
    outputs = llm.generate(prompt_ids, SamplingParams(max_tokens=8, ignore_eos=True))
    for ids, out in zip(prompt_ids, outputs, strict=True):
        assert out.token_ids[:min_same_tokens] == hf_greedy(smollm2_hf, ids, min_same_tokens)
