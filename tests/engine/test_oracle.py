"""Greedy output equals HF transformers token for token, batched, under every scheduling mode."""

from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.weights import load_model
from tests.engine.hf_oracle import hf_greedy, hf_last_logits, hf_model_from

NUM_NEW_TOKENS = 24
GREEDY = SamplingParams(max_tokens=NUM_NEW_TOKENS, ignore_eos=True)

# Scheduling modes every oracle comparison runs under. The tiny pool forces preemption.
MODES = {
    "default": {},
    "no-chunked-prefill": {"enable_chunked_prefill": False},
    "small-chunks": {"max_num_batched_tokens": 24},
    "no-prefix-caching": {"enable_prefix_caching": False},
    "preemption": {"num_kv_blocks": 16, "block_size": 8, "max_model_len": 128, "max_num_batched_tokens": 32},
}


def dummy_prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(1234)
    shared = [rng.randrange(3, vocab_size) for _ in range(40)]
    lengths = [1, 5, 17, 33, 48, 64, 71, 90]
    prompts = [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]
    prompts += [shared + [rng.randrange(3, vocab_size) for _ in range(k)] for k in (3, 9)]
    return prompts


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("dummy:tiny")
    prompts = dummy_prompts(loaded.config.vocab_size)
    hf = hf_model_from(loaded.config, loaded.state_dict)
    expected = [hf_greedy(hf, p, NUM_NEW_TOKENS) for p in prompts]
    return loaded, prompts, expected, hf


@pytest.mark.parametrize("mode", sorted(MODES))
def test_dummy_greedy_matches_hf(tiny, mode: str) -> None:
    loaded, prompts, expected, _ = tiny
    llm = LLM("dummy:tiny", loaded=loaded, **MODES[mode])
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == expected
    stats = llm.engine.stats()
    if mode == "preemption":
        assert stats.num_preemptions_total > 0
    # Invariant: the pool is idle once everything finished.
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_kv_blocks_free == stats.num_kv_blocks
    assert all(b.ref_count == 0 for b in llm.engine.scheduler.block_manager.blocks)


def test_dummy_prefix_cache_hits_give_identical_tokens(tiny) -> None:
    loaded, prompts, expected, _ = tiny
    llm = LLM("dummy:tiny", loaded=loaded, max_num_batched_tokens=32)
    first = llm.generate(prompts, GREEDY)
    hits_after_first = llm.engine.stats().num_prefix_hit_tokens
    second = llm.generate(prompts, GREEDY)
    assert llm.engine.stats().num_prefix_hit_tokens > hits_after_first
    assert [o.token_ids for o in first] == [o.token_ids for o in second] == expected
    assert any(o.num_cached_tokens > 0 for o in second)


def test_dummy_logits_match_hf(tiny) -> None:
    loaded, prompts, _, hf = tiny
    llm = LLM("dummy:tiny", loaded=loaded)
    engine = llm.engine
    for prompt in prompts[:4]:
        ours = _engine_prefill_logits(engine, prompt)
        torch.testing.assert_close(ours, hf_last_logits(hf, prompt), rtol=1e-4, atol=1e-4)


def _engine_prefill_logits(engine, prompt: list[int]) -> torch.Tensor:
    """Run one prefill through the engine's own scheduler and runner and return the last logits."""
    rid = engine.add_request(prompt, SamplingParams(max_tokens=1))
    sched = engine.scheduler.schedule()
    inputs = engine.runner.prepare_inputs(sched)
    with torch.inference_mode():
        hidden = engine.runner.model(inputs.input_ids, inputs.positions, engine.runner.kv_caches, inputs.meta)
        logits = engine.runner.model.compute_logits(hidden.index_select(0, inputs.logits_indices))
    engine.abort(rid)
    return logits[0]


# -- real weights ---------------------------------------------------------------------------------

REAL_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4,",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "Paris",
    "The three primary colors are red, blue and",
    "In machine learning, a transformer is a neural network architecture that relies on attention. "
    "It was introduced in 2017 in the paper",
]


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_hf, smollm2_loaded):
    hf, loaded = smollm2_hf, smollm2_loaded
    llm = LLM("smollm2-135m", loaded=loaded)
    prompt_ids = [llm.tokenizer.encode(p) for p in REAL_PROMPTS]
    expected = [hf_greedy(hf, ids, NUM_NEW_TOKENS) for ids in prompt_ids]
    return llm, prompt_ids, expected, hf, loaded


@pytest.mark.real_model
def test_smollm2_greedy_matches_hf_batched(smollm2_reference) -> None:
    llm, prompt_ids, expected, _, _ = smollm2_reference
    outputs = llm.generate(prompt_ids, GREEDY)
    assert [o.token_ids for o in outputs] == expected
    assert "Paris" in outputs[0].text


@pytest.mark.real_model
@pytest.mark.parametrize("mode", ["no-chunked-prefill", "small-chunks", "no-prefix-caching", "preemption"])
def test_smollm2_greedy_matches_hf_under_scheduling_modes(smollm2_reference, mode: str) -> None:
    _, prompt_ids, expected, _, loaded = smollm2_reference
    other = LLM("smollm2-135m", loaded=loaded, **MODES[mode])
    outputs = other.generate(prompt_ids, GREEDY)
    assert [o.token_ids for o in outputs] == expected
    if mode == "preemption":
        assert other.engine.stats().num_preemptions_total > 0


@pytest.mark.real_model
def test_smollm2_logits_match_hf(smollm2_reference) -> None:
    llm, prompt_ids, _, hf, _ = smollm2_reference
    for ids in prompt_ids[:3]:
        torch.testing.assert_close(_engine_prefill_logits(llm.engine, ids), hf_last_logits(hf, ids),
                                   rtol=1e-3, atol=1e-3)
