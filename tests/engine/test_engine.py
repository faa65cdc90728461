"""LLMEngine and LLM on the dummy model: API, sampling, stops, aborts, observers, bad input."""

from __future__ import annotations

import pytest

from engine import LLM, EngineConfig, LLMEngine, RequestEventKind, SamplingParams
from engine.weights import load_model


@pytest.fixture(scope="module")
def tiny_loaded():
    return load_model("dummy:tiny")


@pytest.fixture
def llm(tiny_loaded) -> LLM:
    return LLM("dummy:tiny", loaded=tiny_loaded)


def test_generate_returns_outputs_in_prompt_order(llm: LLM) -> None:
    prompts = [[5, 6, 7], [8] * 30, [9, 10]]
    together = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    alone = [llm.generate([p], SamplingParams(max_tokens=6, ignore_eos=True))[0] for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert all(len(o.token_ids) == 6 and o.finish_reason == "length" for o in together)


def test_text_prompts_and_text_output(llm: LLM) -> None:
    out = llm.generate("hello world", SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.tokenizer.encode("hello world", add_special_tokens=True)
    assert out.text == llm.tokenizer.decode(out.token_ids)


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm: LLM) -> None:
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
    alone = llm.generate([[3, 4, 5]], seeded)[0].token_ids
    noise = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    batched = llm.generate([[1, 2], [3, 4, 5], [6]], [noise, seeded, noise])[1].token_ids
    assert alone == batched
    other_seed = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=12, temperature=1.0, seed=8,
                                                         ignore_eos=True))[0].token_ids
    assert other_seed != alone


def test_top_k_one_is_greedy(llm: LLM) -> None:
    greedy = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids
    top1 = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=8, temperature=1.5, top_k=1, seed=1,
                                                   ignore_eos=True))[0].token_ids
    assert top1 == greedy


def test_stop_token_ids_and_stop_strings(llm: LLM) -> None:
    free = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stop_id = free.token_ids[4]
    first = free.token_ids.index(stop_id)
    by_id = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id]))[0]
    assert by_id.token_ids == free.token_ids[: first + 1]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == stop_id

    text = free.text
    stop_str = text[len(text) // 2: len(text) // 2 + 2]
    if not stop_str.strip():
        pytest.skip("generated text has no usable stop string")
    by_str = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop_str]))[0]
    assert by_str.finish_reason == "stop" and by_str.stop_reason == stop_str
    assert by_str.text == text[: text.index(stop_str)]


def test_abort_mid_generation_frees_blocks(tiny_loaded) -> None:
    engine = LLMEngine(EngineConfig(model="dummy:tiny"), tiny_loaded)
    keep = engine.add_request([1, 2, 3] * 10, SamplingParams(max_tokens=20, ignore_eos=True))
    drop = engine.add_request([4, 5, 6] * 10, SamplingParams(max_tokens=20, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.stats().num_kv_blocks_used > 0
    assert engine.abort(drop)
    assert not engine.abort(drop)
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            finished[out.request_id] = out
    assert set(finished) == {keep} and finished[keep].finish_reason == "length"
    stats = engine.stats()
    assert stats.num_kv_blocks_free == stats.num_kv_blocks


class Recorder:
    def __init__(self) -> None:
        self.steps = []
        self.events = []

    def on_step(self, stats) -> None:
        self.steps.append(stats)

    def on_request_event(self, event) -> None:
        self.events.append(event)


def test_observer_sees_every_step_and_request_event(tiny_loaded) -> None:
    engine = LLMEngine(EngineConfig(model="dummy:tiny", max_num_batched_tokens=16), tiny_loaded)
    recorder = Recorder()
    engine.add_observer(recorder)
    ids = [engine.add_request([7] * n, SamplingParams(max_tokens=5, ignore_eos=True)) for n in (3, 20, 9)]
    while engine.has_unfinished():
        engine.step()
    assert len(recorder.steps) == engine.num_steps
    assert [s.step_index for s in recorder.steps] == list(range(engine.num_steps))
    assert max(s.num_seqs for s in recorder.steps) == 3
    assert sum(s.num_prefill_tokens for s in recorder.steps) == 32
    assert sum(s.num_decode_tokens for s in recorder.steps) == 3 * 4
    for rid in ids:
        kinds = [e.kind for e in recorder.events if e.request_id == rid]
        assert kinds[0] == RequestEventKind.ARRIVED and kinds[-1] == RequestEventKind.FINISHED
        assert kinds.count(RequestEventKind.TOKEN) == 5
        times = [e.time for e in recorder.events if e.request_id == rid]
        assert times == sorted(times)


def test_host_overhead_knob_is_burnt_and_reported(tiny_loaded) -> None:
    engine = LLMEngine(EngineConfig(model="dummy:tiny", host_overhead_ms=5.0), tiny_loaded)
    recorder = Recorder()
    engine.add_observer(recorder)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert all(s.host_overhead_s >= 0.005 for s in recorder.steps)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_size": 0}, "block_size must be a positive integer"),
        ({"max_num_seqs": -1}, "max_num_seqs must be a positive integer"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"execution": "turbo"}, "execution must be"),
        ({"num_kv_blocks": 4, "kv_cache_mb": 1.0}, "either num_kv_blocks or kv_cache_mb"),
    ],
)
def test_invalid_config_says_what_is_wrong(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="dummy:tiny", **kwargs)


def test_kv_pool_too_small_for_one_request(tiny_loaded) -> None:
    with pytest.raises(ValueError, match="KV pool too small for one request"):
        LLMEngine(EngineConfig(model="dummy:tiny", num_kv_blocks=2, max_model_len=512), tiny_loaded)


def test_context_longer_than_model_is_rejected(tiny_loaded) -> None:
    with pytest.raises(ValueError, match="exceeds the model's context"):
        LLMEngine(EngineConfig(model="dummy:tiny", max_model_len=10**6), tiny_loaded)


def test_prompt_longer_than_context_is_rejected(tiny_loaded) -> None:
    engine = LLMEngine(EngineConfig(model="dummy:tiny", max_model_len=64), tiny_loaded)
    with pytest.raises(ValueError, match="leaves no room to generate within max_model_len=64"):
        engine.add_request([1] * 64)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request([])
    with pytest.raises(ValueError, match="token ids must be integers"):
        engine.add_request([1, 10**9])
    assert not engine.has_unfinished()


def test_unknown_model_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="dummy:"):
        LLM("no-such-model")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_sampling_params(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_stop_string_on_the_last_allowed_token_reports_stop(llm: LLM) -> None:
    free = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    ends = [llm.tokenizer.decode(free.token_ids[:n]) for n in range(1, 13)]
    n = next((n for n in range(3, 13) if ends[n - 1] and ends[n - 1][-1].isprintable()
              and ends[n - 1][-1] not in ends[n - 1][:-1] and ends[n - 1] != ends[n - 2]), None)
    if n is None:
        pytest.skip("no printable, unique final character to use as a stop string")
    stop = ends[n - 1][-1]
    out = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=n, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == ends[n - 1][:-1]
