"""Shared fixtures: one real dummy:tiny engine, a local Prometheus endpoint, one complete probed run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from engine import EngineConfig, LLMEngine
from probes.loader import RunData
from probes.session import ProbeSession
from tests.probes.workload import DrivenRun, drive, random_prompts


@pytest.fixture(scope="session")
def shared_engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="dummy:tiny"))


@pytest.fixture
def engine(shared_engine: LLMEngine) -> Iterator[LLMEngine]:
    """The shared engine; each test must leave it idle and without observers."""
    yield shared_engine
    assert not shared_engine.has_unfinished(), "a test left requests in the shared engine"
    assert not shared_engine.observers, "a test left observers on the shared engine"


@dataclass(slots=True)
class MetricsServer:
    url: str
    registry: CollectorRegistry
    running: Gauge
    finished: Counter


@pytest.fixture(scope="session")
def metrics_server() -> Iterator[MetricsServer]:
    """A real HTTP server on 127.0.0.1 serving prometheus-client's exposition of a private registry."""
    registry = CollectorRegistry()
    running = Gauge("test_num_requests_running", "Requests running", ["model_name"], registry=registry)
    finished = Counter("test_requests_finished", "Requests finished", registry=registry)
    running.labels(model_name="dummy:tiny").set(3)
    finished.inc(7)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield MetricsServer(f"http://127.0.0.1:{server.server_port}/metrics", registry, running, finished)
    server.shutdown()
    server.server_close()
    thread.join()


@dataclass(slots=True)
class CompleteRun:
    path: Path
    run: RunData
    driven: DrivenRun
    engine: LLMEngine


@pytest.fixture(scope="session")
def complete_run(shared_engine: LLMEngine, metrics_server: MetricsServer,
                 tmp_path_factory: pytest.TempPathFactory) -> CompleteRun:
    """A short engine run with every probe on (Prometheus against the local endpoint), stopped cleanly."""
    path = tmp_path_factory.mktemp("complete") / "run"
    session = ProbeSession.for_engine(shared_engine, path, prometheus_url=metrics_server.url,
                                      workload={"name": "probe-tests", "num_requests": 6}, seeds={"workload": 1})
    session.start()
    driven = drive(shared_engine, random_prompts(seed=1, num_prompts=6, length=20), max_tokens=8, prefix="full")
    run = session.stop()
    return CompleteRun(path, run, driven, shared_engine)
