"""A live server on a free 127.0.0.1 port, run by uvicorn on a background thread, over a real engine."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import uvicorn

from engine import EngineConfig, LLMEngine, RequestEvent, RequestEventKind, StepStats
from engine.outputs import EngineStats
from engine.server.app import ServerSettings, build_app
from engine.server.async_engine import AsyncEngine
from engine.server.listen import listening_socket
from engine.server.serving_engine import ServingEngine
from engine.weights import LoadedModel, load_model

API_KEY = "test-key"
MODEL = "dummy:tiny"
STARTUP_TIMEOUT_S = 30.0
# 128 blocks of 16 tokens: 2 full-length (1024-token) requests, or many short ones.
ENGINE_KWARGS = {"execution": "eager", "num_kv_blocks": 128, "max_num_seqs": 8}


class Recorder:
    """An engine observer that keeps what the tests assert on: batch sizes and finish reasons."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batch_sizes: list[int] = []
        self.finish_reasons: dict[str, str | None] = {}

    def on_step(self, stats: StepStats) -> None:
        with self._lock:
            self.batch_sizes.append(stats.num_seqs)

    def on_request_event(self, event: RequestEvent) -> None:
        if event.kind is RequestEventKind.FINISHED:
            with self._lock:
                self.finish_reasons[event.request_id] = event.finish_reason


@dataclass
class LiveServer:
    """A running server: its URL, the engine behind it and an observer on that engine."""

    engine: ServingEngine
    async_engine: AsyncEngine
    recorder: Recorder
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/v1"

    def stats(self) -> EngineStats:
        return self.async_engine.stats()

    def wait_until(self, condition: Callable[[EngineStats], bool], timeout_s: float = 10.0) -> EngineStats:
        """Poll the engine's stats until ``condition`` holds; fails the test after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if condition(stats):
                return stats
            if time.monotonic() > deadline:
                pytest.fail(f"engine never reached the expected state; last stats: {stats}")
            time.sleep(0.02)

    def wait_idle(self, timeout_s: float = 10.0) -> EngineStats:
        return self.wait_until(lambda s: s.num_running == 0 and s.num_waiting == 0
                               and s.num_kv_blocks_free == s.num_kv_blocks, timeout_s)


def tiny_engine(loaded: LoadedModel, **engine_kwargs: object) -> LLMEngine:
    """The continuous engine on the dummy model (``ENGINE_KWARGS`` unless overridden)."""
    return LLMEngine(EngineConfig(model=MODEL, **{**ENGINE_KWARGS, **engine_kwargs}), loaded)  # type: ignore[arg-type]


def start_server(engine: ServingEngine, settings: ServerSettings) -> LiveServer:
    """Serve ``engine`` on a free 127.0.0.1 port from a background thread; returns once it accepts."""
    recorder = Recorder()
    engine.add_observer(recorder)  # type: ignore[attr-defined]
    app = build_app(engine, settings)
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return LiveServer(engine, app.state.async_engine, recorder, port, server, thread)


def stop_server(live: LiveServer) -> None:
    live.server.should_exit = True
    live.thread.join(timeout=15)
    assert not live.thread.is_alive(), "the test server did not shut down"


@pytest.fixture(scope="session")
def tiny_loaded() -> LoadedModel:
    return load_model(MODEL)


@pytest.fixture(scope="session")
def live_server(tiny_loaded: LoadedModel) -> Iterator[LiveServer]:
    """The shared server: API key required, a roomy waiting queue."""
    live = start_server(tiny_engine(tiny_loaded), ServerSettings(api_key=API_KEY))
    yield live
    stop_server(live)


def next_events(lines: Iterator[str], count: int) -> list[dict[str, object]]:
    """The next ``count`` SSE data events from a response's ``iter_lines()``.

    NOTE: callers keep ``lines`` referenced while the stream should stay open: an abandoned
    httpx line iterator, once garbage collected, closes the connection (a client disconnect).
    """
    events: list[dict[str, object]] = []
    while len(events) < count:
        line = next(lines)
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line.removeprefix("data: ")))
    return events
