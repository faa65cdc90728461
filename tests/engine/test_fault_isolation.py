"""A request that makes a step raise fails alone (finish_reason "error", blocks freed); the rest of
its batch finishes with the tokens it would have produced on its own."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.outputs import RequestOutput
from engine.request import Request
from engine.scheduler import SchedulerOutput
from engine.weights import LoadedModel, load_model
from tests.faults import poisoned_forward

POISON_TOKEN = 13  # test-only: a forward whose batch holds a prompt with this token raises
GOOD_PROMPTS = [[5, 6, 7], [8] * 30, [9, 10], [21, 22, 23, 24]]
POISONED_PROMPT = [4, POISON_TOKEN, 4]
PARAMS = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_loaded() -> LoadedModel:
    return load_model("dummy:tiny")


def make_engine(loaded: LoadedModel) -> LLMEngine:
    return LLMEngine(EngineConfig(model="dummy:tiny", execution="eager", num_kv_blocks=64), loaded)


def run_all(engine: LLMEngine, prompts: list[list[int]], late: list[list[int]] = ()) -> dict[str, RequestOutput]:
    """Run ``prompts``; ``late`` ones join after the first step, so they share batches with running ones."""
    ids = [engine.add_request(p, PARAMS) for p in prompts]
    finals: dict[str, RequestOutput] = {}
    first = True
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
        if first:
            ids += [engine.add_request(p, PARAMS) for p in late]
            first = False
    return {rid: finals[rid] for rid in ids}


def test_a_poisoned_request_fails_alone_and_its_batch_completes(tiny_loaded: LoadedModel) -> None:
    alone = [run_all(make_engine(tiny_loaded), [p]) for p in GOOD_PROMPTS]
    engine = make_engine(tiny_loaded)
    with poisoned_forward(engine, lambda request: POISON_TOKEN in request.prompt_token_ids) as failed_batches:
        finals = list(run_all(engine, GOOD_PROMPTS[:2], late=[POISONED_PROMPT, *GOOD_PROMPTS[2:]]).values())
    poisoned = finals[2]
    assert poisoned.finished and poisoned.finish_reason == "error"
    assert "injected" in (poisoned.error or "") and poisoned.token_ids == []
    good = [finals[0], finals[1], *finals[3:]]
    assert [o.token_ids for o in good] == [next(iter(a.values())).token_ids for a in alone]
    assert all(o.finish_reason == "length" and o.error is None for o in good)
    assert max(failed_batches) > 1, "the poisoned request never shared a batch"
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_free) == (0, 0, stats.num_kv_blocks)


def test_a_request_failing_mid_decode_keeps_its_tokens_so_far(tiny_loaded: LoadedModel) -> None:
    engine = make_engine(tiny_loaded)

    # Poisoned once it has generated 4 tokens: it fails mid-decode while the other keeps going.
    def mid_decode(request: Request) -> bool:
        return request.prompt_token_ids == POISONED_PROMPT and request.num_output_tokens >= 4

    with poisoned_forward(engine, mid_decode):
        finals = list(run_all(engine, [POISONED_PROMPT, GOOD_PROMPTS[0]]).values())
    assert finals[0].finish_reason == "error" and len(finals[0].token_ids) == 4
    assert finals[0].text == engine.tokenizer.decode(finals[0].token_ids)
    assert finals[1].finish_reason == "length" and len(finals[1].token_ids) == PARAMS.max_tokens
    assert engine.stats().num_kv_blocks_free == engine.stats().num_kv_blocks


def test_a_transient_batch_failure_fails_nobody(tiny_loaded: LoadedModel) -> None:
    expected = run_all(make_engine(tiny_loaded), GOOD_PROMPTS)
    engine = make_engine(tiny_loaded)
    original = engine.runner.execute
    calls = {"n": 0}

    def fail_third_call(out: SchedulerOutput) -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected: a one-off failure")
        return original(out)

    engine.runner.execute = fail_third_call  # type: ignore[method-assign]
    got = run_all(engine, GOOD_PROMPTS)
    assert [o.token_ids for o in got.values()] == [o.token_ids for o in expected.values()]
    assert all(o.error is None for o in got.values())


def test_a_failure_handling_one_output_fails_only_that_request(tiny_loaded: LoadedModel) -> None:
    engine = make_engine(tiny_loaded)
    original = engine.outputs.add_token
    victim: dict[str, str] = {}

    def add_token(request, token_id):  # type: ignore[no-untyped-def]
        if request.request_id == victim.get("id") and request.num_output_tokens == 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected: a bad byte")
        return original(request, token_id)

    engine.outputs.add_token = add_token  # type: ignore[method-assign]
    victim["id"] = engine.add_request(GOOD_PROMPTS[0], PARAMS)
    other = engine.add_request(GOOD_PROMPTS[1], PARAMS)
    finals: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals[victim["id"]].finish_reason == "error" and "UnicodeDecodeError" in finals[victim["id"]].error
    assert finals[other].finish_reason == "length"
    stats = engine.stats()
    assert (stats.num_running, stats.num_kv_blocks_free) == (0, stats.num_kv_blocks)
