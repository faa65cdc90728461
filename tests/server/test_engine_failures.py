"""A failure inside an engine step fails the requests in flight (500 or an error event), frees their
blocks, and the server goes on serving; stopping the engine fails what is left and refuses more."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine import LLMEngine, SamplingParams
from engine.server.app import ServerSettings
from engine.server.async_engine import AsyncEngine
from engine.server.request_stream import EngineUnavailableError
from engine.weights import LoadedModel
from tests.faults import poisoned_forward
from tests.server.conftest import MODEL, LiveServer, next_events, start_server, stop_server, tiny_engine

BODY = {"model": MODEL, "prompt": "doomed", "max_tokens": 4, "ignore_eos": True}


def fail_next_forward(engine: LLMEngine) -> None:
    """Make the model runner raise once, mid-step (after scheduling allocated the batch's blocks)."""
    original = engine.runner.execute

    def execute_once_failing(*args: object, **kwargs: object) -> object:
        engine.runner.execute = original  # type: ignore[method-assign]
        raise RuntimeError("injected: the device went away")

    engine.runner.execute = execute_once_failing  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def flaky(tiny_loaded: LoadedModel) -> Iterator[LiveServer]:
    live = start_server(tiny_engine(tiny_loaded), ServerSettings())
    yield live
    stop_server(live)


def test_failed_step_is_a_500_and_the_server_recovers(flaky: LiveServer) -> None:
    flaky.wait_idle()
    fail_next_forward(flaky.engine)  # type: ignore[arg-type]
    failed = httpx.post(f"{flaky.api_url}/completions", json=BODY, timeout=30)
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["type"] == "server_error" and "injected" in error["message"]
    idle = flaky.wait_idle()
    assert idle.num_kv_blocks_free == idle.num_kv_blocks
    ok = httpx.post(f"{flaky.api_url}/completions", json=BODY, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def test_failed_step_mid_stream_is_an_error_event(flaky: LiveServer) -> None:
    flaky.wait_idle()
    fail_next_forward(flaky.engine)  # type: ignore[arg-type]
    with httpx.stream("POST", f"{flaky.api_url}/chat/completions", timeout=30,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                            "stream": True}) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    role, error = next_events(iter(lines), 2)
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # type: ignore[index]
    assert "injected" in error["error"]["message"]  # type: ignore[index]
    assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    flaky.wait_idle()
    assert httpx.get(f"{flaky.url}/health", timeout=30).status_code == 200


def test_stop_fails_streams_in_flight_and_refuses_new_requests(tiny_loaded: LoadedModel) -> None:
    engine = tiny_engine(tiny_loaded)

    async def scenario() -> None:
        async_engine = AsyncEngine(engine)
        async_engine.start()
        stream = await async_engine.generate([1, 2, 3], SamplingParams(max_tokens=1000, ignore_eos=True), "long")
        first = await anext(stream)
        assert not first.finished
        await async_engine.stop()
        with pytest.raises(EngineUnavailableError):
            async for _ in stream:
                pass
        with pytest.raises(EngineUnavailableError):
            await async_engine.generate([1, 2, 3], SamplingParams(max_tokens=2), "late")
        assert not async_engine.is_alive

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_free) == (0, 0, stats.num_kv_blocks)


def test_requests_after_the_engine_stopped_are_503_with_retry_after(tiny_loaded: LoadedModel) -> None:
    live = start_server(tiny_engine(tiny_loaded), ServerSettings())
    try:
        loop = live.async_engine._loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(live.async_engine.stop(), loop).result(timeout=30)
        response = httpx.post(f"{live.api_url}/completions", json=BODY, timeout=30)
        assert response.status_code == 503 and int(response.headers["Retry-After"]) >= 1
        assert response.json()["error"]["code"] == "unavailable"
        assert httpx.get(f"{live.url}/health", timeout=30).status_code == 503
    finally:
        stop_server(live)


POISON_TOKEN = 13  # test-only: a forward whose batch holds a prompt with this token raises
GOOD_PROMPTS = [[5, 6, 7], [8] * 20, [9, 10]]


@pytest.fixture(scope="module")
def poisonable(tiny_loaded: LoadedModel) -> Iterator[LiveServer]:
    """Steps burn 5 ms of host time, so 200-token requests stay in flight for a second or more."""
    live = start_server(tiny_engine(tiny_loaded, host_overhead_ms=5), ServerSettings())
    yield live
    stop_server(live)


def _completion_text(url: str, prompt: list[int]) -> str:
    response = httpx.post(f"{url}/completions", timeout=60,
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 200, "temperature": 0,
                                "ignore_eos": True})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_a_poisoned_request_is_a_500_and_the_rest_of_its_batch_completes(poisonable: LiveServer) -> None:
    expected = [_completion_text(poisonable.api_url, prompt) for prompt in GOOD_PROMPTS]
    engine: LLMEngine = poisonable.engine  # type: ignore[assignment]
    with poisoned_forward(engine, lambda request: POISON_TOKEN in request.prompt_token_ids) as failed_batch_sizes, \
            ThreadPoolExecutor(len(GOOD_PROMPTS)) as pool:
        good = [pool.submit(_completion_text, poisonable.api_url, prompt) for prompt in GOOD_PROMPTS]
        poisonable.wait_until(lambda s: s.num_running == len(GOOD_PROMPTS), timeout_s=30)
        poisoned = httpx.post(f"{poisonable.api_url}/completions", timeout=60,
                              json={"model": MODEL, "prompt": [4, POISON_TOKEN, 4], "max_tokens": 200})
        texts = [future.result(timeout=60) for future in good]
    assert poisoned.status_code == 500
    error = poisoned.json()["error"]
    assert error["type"] == "server_error" and "injected" in error["message"]
    assert max(failed_batch_sizes) > 1, "the poisoned request never shared a batch with the others"
    assert texts == expected
    idle = poisonable.wait_idle()
    assert idle.num_kv_blocks_free == idle.num_kv_blocks
    metrics = httpx.get(f"{poisonable.url}/metrics", timeout=30).text
    assert any(line.startswith("servescope:request_errors_total") and line.endswith(" 1.0")
               for line in metrics.splitlines())
