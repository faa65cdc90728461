"""The fused decode step (engine/cpu_kernels/decode_step.c) against the model's own layer-by-layer forward.

Both run the same quantized GEMM, so they differ only where the C step's norms, rotary embedding and SiLU
sum or round in another order than torch, and where such a last-bit difference moves an activation across
a rounding boundary of the GEMM's 16-bit activations (one step is 1/32767 of its group's largest): in
float32 by about that step, in bfloat16 by at most a few bfloat16 steps; with 8-bit activations
(``--int4-act-bits 8``, a step of 1/127) by a few 8-bit steps.
Batches mix context lengths, GQA heads (dummy:tiny has 4 query heads over 2 KV heads) and
block boundaries; the engine's tokens with and without the fused step must be the same.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cpu_kernels import cpu_kernels
from engine.cpu_kernels.decode_step import why_not_fused
from engine.weights import load_model

KERNELS, WHY = cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason=f"the CPU kernels cannot be built here: {WHY}")
PROMPTS = [[5, 6, 7], [100] * 20, [300, 2, 9, 9] * 5, [1] * 37, list(range(40, 57))]


def _llm(dtype: str, **overrides: object) -> LLM:
    loaded = load_model("dummy:tiny", getattr(torch, dtype))
    return LLM("dummy:tiny", loaded=loaded, dtype=dtype, weights="int4", device="cpu", block_size=8, **overrides)


def _decode_step_both_ways(llm: LLM) -> tuple[torch.Tensor, torch.Tensor]:
    """The first all-decode step of the prompts' generation, through both paths on the same inputs."""
    runner = llm.engine.runner
    execute = runner.execute
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def both_ways(out):  # noqa: ANN001, ANN202
        inputs = runner.prepare_inputs(out)
        if not seen and not inputs.meta.prefill_ids and inputs.meta.num_seqs == len(PROMPTS):
            with torch.inference_mode():
                # NOTE: both write this step's K/V into the same cache slots, with the same values
                layered = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)
                seen.append((runner.fused_decode.run(inputs.input_ids, inputs.positions, inputs.meta), layered))
        return execute(out)

    runner.execute = both_ways
    llm.generate(PROMPTS, SamplingParams(max_tokens=3, ignore_eos=True))
    assert seen, "no step decoded every prompt at once"
    return seen[0]


def test_an_int4_model_on_the_optimized_cpu_path_gets_the_fused_step() -> None:
    assert _llm("bfloat16").engine.runner.fused_decode is not None
    assert _llm("bfloat16", execution="eager").engine.runner.fused_decode is None
    dense = LLM("dummy:tiny", loaded=load_model("dummy:tiny"), device="cpu")
    assert dense.engine.runner.fused_decode is None
    assert "not int4-kernel" in str(why_not_fused(dense.engine.runner.model, dense.engine.runner.kv_caches))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_step_gives_the_layered_forwards_hidden_states(dtype: str) -> None:
    fused, layered = _decode_step_both_ways(_llm(dtype))
    assert fused.dtype == layered.dtype and fused.shape == layered.shape
    scale = float(layered.float().abs().max())
    if dtype == "float32":  # a few 16-bit activation steps, through two layers
        torch.testing.assert_close(fused, layered, rtol=0, atol=1e-3 * scale)
    else:  # a few bfloat16 steps (2^-8 relative each) where a rounding lands the other way
        torch.testing.assert_close(fused.float(), layered.float(), rtol=0.03, atol=0.03)


def test_fused_step_with_eight_bit_activations_gives_the_layered_forwards_hidden_states() -> None:
    llm = _llm("float32", int4_act_bits=8)
    assert llm.engine.runner.fused_decode._md.act_bits == 8
    assert llm.engine.runner.model.model.layers[0].mlp.down_proj.kind == "int4-kernel-a8"
    fused, layered = _decode_step_both_ways(llm)
    # a few 8-bit steps (1/127 of a group's largest) where a last-bit difference crossed a rounding boundary: one
    # such code in the first layer moves every output of the next (measured: 1.8% of the largest output at most)
    torch.testing.assert_close(fused, layered, rtol=0, atol=5e-2 * float(layered.abs().max()))
    sixteen, _ = _decode_step_both_ways(_llm("float32"))
    assert not torch.equal(fused, sixteen)  # the fused step itself rounds to 8 bits, not 16


def test_engine_tokens_are_the_same_with_and_without_the_fused_step() -> None:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    fused = _llm("float32")
    layered = _llm("float32")
    layered.engine.runner.fused_decode = None
    assert [o.token_ids for o in fused.generate(PROMPTS, params)] == \
        [o.token_ids for o in layered.generate(PROMPTS, params)]


def test_int4_dense_rows_gives_every_projection_a_dense_copy_and_the_same_tokens() -> None:
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    plain = _llm("float32")
    with_copy = _llm("float32", int4_dense_rows=16)
    layer = with_copy.engine.runner.model.model.layers[0]
    assert layer.mlp.down_proj.dense is not None and layer.mlp.down_proj.dense_from_rows == 16
    assert plain.engine.runner.model.model.layers[0].mlp.down_proj.dense is None
    # prompts of 17+ tokens take the dense copy: float32 GEMMs of the same weights, so the same greedy tokens
    assert [o.token_ids for o in with_copy.generate(PROMPTS, params)] == \
        [o.token_ids for o in plain.generate(PROMPTS, params)]


def test_the_dense_copy_is_kept_by_default_only_where_bfloat16_gemms_are_native() -> None:
    from engine.model.kernel_projection import BF16_DENSE_FROM_ROWS
    from engine.model.projection import native_bf16_gemm

    def down(llm: LLM):  # noqa: ANN202
        return llm.engine.runner.model.model.layers[0].mlp.down_proj

    bf16 = down(_llm("bfloat16"))
    if native_bf16_gemm() is not None:
        assert bf16.dense is not None and bf16.dense_from_rows == BF16_DENSE_FROM_ROWS
    else:
        assert bf16.dense is None
    assert down(_llm("float32")).dense is None
    assert down(_llm("bfloat16", int4_dense_rows=100_000)).dense is None  # beyond the token budget: no copy


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_steps_own_head_gives_the_logits_compute_logits_gives(dtype: str) -> None:
    llm = _llm(dtype)
    runner = llm.engine.runner
    execute = runner.execute
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def both_ways(out):  # noqa: ANN001, ANN202
        rows = runner.decode_rows(out)
        if rows is not None and not seen and rows.num_rows == len(PROMPTS):
            inputs = runner.prepare_inputs(out)
            with torch.inference_mode():
                # NOTE: both write this step's K/V into the same cache slots, with the same values
                apart = runner.model.compute_logits(runner.fused_decode.run(inputs.input_ids, inputs.positions,
                                                                            inputs.meta))
            seen.append((runner.fused_decode.logits(rows).clone(), apart))
        return execute(out)

    runner.execute = both_ways
    llm.generate(PROMPTS, SamplingParams(max_tokens=3, ignore_eos=True))
    assert seen, "no step decoded every prompt at once"
    fused, apart = seen[0]
    assert fused.dtype == torch.float32 and fused.shape == (len(PROMPTS), runner.model_config.vocab_size)
    assert torch.equal(fused, apart)  # the same C GEMM over the same hidden states, rounded to the dtype alike


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_fused_step_gives_the_same_bits_on_one_two_or_three_threads(dtype: str) -> None:
    """Up to PRIVATE_ROWS (4) rows on several threads, every thread computes the norms, SiLU and rotated Q and K into
    its own rows, and the attention reads the new token's K and V from them (decode_step.c); five rows, or one thread,
    share them and read the cache: the same arithmetic in the same order, so the same bits every way. dummy:tiny's 4
    heads take the attention's chunked passes for one row on two or three threads (45 tokens: the new one in the
    second chunk of 32), its one-pass path otherwise."""
    from engine.cpu_kernels.decode_step import DecodeRows

    runner = _llm(dtype).engine.runner
    bs = 8
    lens = [45, 9, 17, 8, 30]  # across block boundaries; each row its own blocks
    tables = [[10 * r + b for b in range((n + bs - 1) // bs)] for r, n in enumerate(lens)]
    slots = [t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens, strict=True)]
    ids = [i % runner.model_config.vocab_size for i in (7, 300, 42, 5, 999)]
    threads = torch.get_num_threads()
    try:
        for m in (1, 4, 5):
            rows = DecodeRows.build(ids[:m], [n - 1 for n in lens[:m]], slots[:m], lens[:m], tables[:m])
            outs = []
            for t in (2, 3, 1):
                for k, v in runner.kv_caches:  # the new tokens' slots cleared: each call must write what it reads
                    k.flatten(0, 1)[slots[:m]] = 0
                    v.flatten(0, 1)[slots[:m]] = 0
                torch.set_num_threads(t)
                outs.append(runner.fused_decode.logits(rows).clone())
            assert all(torch.equal(outs[0], o) for o in outs[1:]), f"{m} rows"
            assert bool(torch.isfinite(outs[0]).all()) and outs[0].abs().max() > 0
    finally:
        torch.set_num_threads(threads)


def test_a_token_outside_the_vocabulary_is_refused_before_the_step() -> None:
    from engine.cpu_kernels.decode_step import DecodeRows

    runner = _llm("float32").engine.runner
    vocab = runner.model_config.vocab_size
    with pytest.raises(ValueError, match="outside the vocabulary"):
        runner.fused_decode.logits(DecodeRows.build([vocab], [0], [0], [1], [[0]]))
    assert runner.fused_decode.logits(DecodeRows.build([vocab - 1], [0], [0], [1], [[0]])).shape == (1, vocab)


def test_only_steps_where_every_request_decodes_and_samples_take_the_rows() -> None:
    llm = _llm("float32")
    runner = llm.engine.runner
    kinds: list[bool] = []
    decode_rows = runner.decode_rows

    def record(out):  # noqa: ANN001, ANN202
        rows = decode_rows(out)
        kinds.append(rows is not None)
        assert (rows is not None) == all(i.num_new_tokens == 1 and i.samples_token for i in out.scheduled)
        return rows

    runner.decode_rows = record
    llm.generate(PROMPTS, SamplingParams(max_tokens=4, ignore_eos=True))
    assert True in kinds and False in kinds  # prompt steps took the general path, decode steps the rows
