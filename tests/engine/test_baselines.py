"""The HF baselines (naive, static, hf-cb) agree with the engine and behave as the raw-framework servers they model."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.baselines import HFContinuousBatchingEngine, NaiveEngine, StaticBatchEngine
from engine.weights import load_model

PROMPTS = [[5, 6, 7], [100] * 20, [300, 2, 9, 9], [1] * 7, [42] * 33]


@pytest.fixture(scope="module")
def tiny():
    return load_model("dummy:tiny")


class StepRecorder:
    def __init__(self) -> None:
        self.steps = []

    def on_step(self, stats) -> None:
        self.steps.append(stats)

    def on_request_event(self, event) -> None:
        pass


def drain(engine, max_steps: int = 10_000) -> dict:
    """Step ``engine`` until nothing is unfinished (at most ``max_steps``); its finished outputs by request id."""
    finished = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return finished


def run_all(engine, params_list) -> list[list[int]]:
    ids = [engine.add_request(p, sp) for p, sp in zip(PROMPTS, params_list, strict=True)]
    finished = drain(engine)
    return [finished[i].token_ids for i in ids]


@pytest.mark.parametrize("engine_cls", [NaiveEngine, StaticBatchEngine, HFContinuousBatchingEngine])
def test_greedy_matches_the_engine(tiny, engine_cls) -> None:
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (10, 3, 7, 12, 5)]
    expected = run_all(LLMEngine(EngineConfig(model="dummy:tiny"), tiny), params)
    assert run_all(engine_cls(EngineConfig(model="dummy:tiny"), tiny), params) == expected


def _logprobs(engine, params: SamplingParams) -> list[list[float]]:
    ids = [engine.add_request(p, params) for p in PROMPTS]
    finished = drain(engine)
    return [[lp.logprob for lp in finished[i].logprobs] for i in ids]


def test_static_batch_reports_the_engines_logprobs(tiny) -> None:
    """Padded static batches (HF's model, left padding) compute the engine's log-probabilities."""
    params = SamplingParams(max_tokens=6, min_tokens=6, logprobs=1)
    expected = _logprobs(LLMEngine(EngineConfig(model="dummy:tiny"), tiny), params)
    got = _logprobs(StaticBatchEngine(EngineConfig(model="dummy:tiny"), tiny), params)
    assert [len(x) for x in got] == [6] * len(PROMPTS)
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, abs=1e-3)


def test_static_batch_admits_nobody_until_it_drains(tiny) -> None:
    engine = StaticBatchEngine(EngineConfig(model="dummy:tiny", max_num_seqs=2), tiny)
    recorder = StepRecorder()
    engine.add_observer(recorder)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (2, 8, 3, 3, 3)]
    run_all(engine, params)
    # Batches of {2, 8}, {3, 3}, {3}: the short request's row idles for 6 steps while the long one runs.
    assert [s.num_seqs for s in recorder.steps] == [2, 2, 1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1]
    wasted = [s.num_kv_slots_allocated - s.num_kv_slots_used for s in recorder.steps]
    assert max(wasted) > 0  # padding and finished rows hold cache slots


def test_naive_serves_one_request_at_a_time(tiny) -> None:
    engine = NaiveEngine(EngineConfig(model="dummy:tiny"), tiny)
    recorder = StepRecorder()
    engine.add_observer(recorder)
    run_all(engine, [SamplingParams(max_tokens=4, ignore_eos=True)] * len(PROMPTS))
    assert {s.num_seqs for s in recorder.steps} == {1}
    assert len(recorder.steps) == 4 * len(PROMPTS)
    assert all(s.num_kv_slots_allocated == s.num_kv_slots_used for s in recorder.steps)


def test_abort_in_a_static_batch(tiny) -> None:
    engine = StaticBatchEngine(EngineConfig(model="dummy:tiny"), tiny)
    keep = engine.add_request([1, 2, 3], SamplingParams(max_tokens=6, ignore_eos=True))
    drop = engine.add_request([4, 5, 6], SamplingParams(max_tokens=6, ignore_eos=True))
    queued = engine.add_request([7, 8], SamplingParams(max_tokens=6, ignore_eos=True))
    engine.step()
    assert engine.abort(drop) and not engine.abort(drop)
    assert set(drain(engine)) == {keep, queued}
    assert engine.stats().num_running == 0


def test_seeded_sampling_matches_the_engine(tiny) -> None:
    params = [SamplingParams(max_tokens=6, temperature=0.9, seed=11 + i, ignore_eos=True) for i in range(5)]
    expected = run_all(LLMEngine(EngineConfig(model="dummy:tiny"), tiny), params)
    assert run_all(StaticBatchEngine(EngineConfig(model="dummy:tiny"), tiny), params) == expected


def test_static_batch_is_capped_by_max_length_reservations_in_the_kv_budget(tiny) -> None:
    # 64 blocks of 16 slots = 1024 slots; reserving max_model_len=256 per row leaves room for 4.
    engine = StaticBatchEngine(EngineConfig(model="dummy:tiny", num_kv_blocks=64, max_model_len=256,
                                            max_num_seqs=16), tiny)
    assert engine.max_batch_size == 4


def test_hf_cb_matches_the_naive_baseline_while_batching(tiny) -> None:
    """HF's continuous batching runs the five prompts together and yields the one-at-a-time HF tokens."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (10, 3, 7, 12, 5)]
    expected = run_all(NaiveEngine(EngineConfig(model="dummy:tiny"), tiny), params)
    engine = HFContinuousBatchingEngine(EngineConfig(model="dummy:tiny"), tiny)
    recorder = StepRecorder()
    engine.add_observer(recorder)
    assert run_all(engine, params) == expected
    assert max(s.num_seqs for s in recorder.steps) == len(PROMPTS)
    assert len(recorder.steps) < sum(p.max_tokens for p in params)  # fewer steps than one at a time


def test_hf_cb_stops_on_the_engines_rules_and_frees_hf_state(tiny) -> None:
    """A stop token ends the request here and cancels it in HF; an aborted one is gone from HF too."""
    engine = HFContinuousBatchingEngine(EngineConfig(model="dummy:tiny"), tiny)
    free_run = run_all(engine, [SamplingParams(max_tokens=8, ignore_eos=True)] * len(PROMPTS))
    stop_at = free_run[0][2]
    params = [SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=[stop_at])] + \
             [SamplingParams(max_tokens=8, ignore_eos=True)] * (len(PROMPTS) - 1)
    got = run_all(engine, params)
    assert got[0] == free_run[0][:free_run[0].index(stop_at) + 1]
    assert got[1:] == free_run[1:]
    keep = engine.add_request([1, 2, 3], SamplingParams(max_tokens=6, ignore_eos=True))
    drop = engine.add_request([4, 5, 6], SamplingParams(max_tokens=6, ignore_eos=True))
    engine.step()
    assert engine.abort(drop) and not engine.abort(drop)
    assert set(drain(engine)) == {keep}
    engine.step()  # HF applies the cancellations queued by the stop and the abort before it schedules
    assert engine.processor.scheduler.active_requests == {} == engine.processor.scheduler.waiting_requests
    assert engine.stats().num_running == 0


def test_hf_cb_refuses_what_hf_cannot_do_per_request(tiny) -> None:
    engine = HFContinuousBatchingEngine(EngineConfig(model="dummy:tiny"), tiny)
    for params in (SamplingParams(temperature=0.7), SamplingParams(min_tokens=2), SamplingParams(logprobs=1)):
        with pytest.raises(ValueError, match="hf-cb"):
            engine.add_request([1, 2, 3], params)
    assert not engine.has_unfinished()


def test_hf_cb_reports_the_pages_it_holds(tiny) -> None:
    """KV slots come from HF's own block tables: whole pages held, a partly filled last page each."""
    engine = HFContinuousBatchingEngine(EngineConfig(model="dummy:tiny", block_size=16), tiny)
    recorder = StepRecorder()
    engine.add_observer(recorder)
    run_all(engine, [SamplingParams(max_tokens=4, ignore_eos=True)] * len(PROMPTS))
    first = recorder.steps[0]  # every prompt prefilled: 3, 20, 4, 7 and 33 tokens take 1+2+1+1+3 pages
    assert first.num_kv_slots_allocated == 8 * 16
    assert all(0 < s.num_kv_slots_used < s.num_kv_slots_allocated for s in recorder.steps[:-1])
