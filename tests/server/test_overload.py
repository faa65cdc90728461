"""Load far beyond what the server can take: the waiting queue stays bounded, the excess is refused
fast with Retry-After, every accepted request completes; clients dropping mid-stream leak nothing;
a KV pool far too small for the concurrency preempts and recomputes, and every answer is the one
the request gets alone. Every loop is bounded in count and time; all traffic is on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from engine.server.app import ServerSettings
from engine.weights import LoadedModel
from tests.server.conftest import MODEL, LiveServer, start_server, stop_server, tiny_engine

CLIENT_TIMEOUT_S = 120.0


class StatsSampler:
    """Samples the engine's queue lengths on a thread while a scenario runs."""

    def __init__(self, live: LiveServer, interval_s: float = 0.005) -> None:
        self._live = live
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.max_waiting = 0
        self.max_running = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StatsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            stats = self._live.stats()
            self.max_waiting = max(self.max_waiting, stats.num_waiting)
            self.max_running = max(self.max_running, stats.num_running)
            time.sleep(self._interval_s)


@dataclass(slots=True)
class Outcome:
    status: int
    latency_s: float
    retry_after: str | None
    completion_tokens: int | None


# -- overload ----------------------------------------------------------------------------------------
MAX_WAITING = 8
OVERLOAD_REQUESTS = 240
OVERLOAD_RATE_PER_S = 400.0  # far past capacity: a step burns 2 ms and at most 4 sequences run


@pytest.fixture(scope="module")
def small_server(tiny_loaded: LoadedModel) -> Iterator[LiveServer]:
    live = start_server(tiny_engine(tiny_loaded, max_num_seqs=4, host_overhead_ms=2),
                        ServerSettings(max_waiting=MAX_WAITING))
    yield live
    stop_server(live)


async def _open_loop(url: str, num_requests: int, rate_per_s: float, max_tokens: int) -> list[Outcome]:
    """Poisson arrivals whatever the server does; each request records its status and latency."""
    rng = random.Random(0)
    limits = httpx.Limits(max_connections=num_requests, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        async def one(index: int) -> Outcome:
            started = time.perf_counter()
            response = await client.post("/completions", json={
                "model": MODEL, "prompt": [5 + index % 50, 6, 7], "max_tokens": max_tokens, "ignore_eos": True})
            latency = time.perf_counter() - started
            tokens = response.json()["usage"]["completion_tokens"] if response.status_code == 200 else None
            return Outcome(response.status_code, latency, response.headers.get("retry-after"), tokens)

        tasks = []
        for index in range(num_requests):
            tasks.append(asyncio.create_task(one(index)))
            await asyncio.sleep(rng.expovariate(rate_per_s))
        return await asyncio.gather(*tasks)


def test_open_loop_overload_is_refused_fast_and_bounded(small_server: LiveServer) -> None:
    small_server.wait_idle()
    with StatsSampler(small_server) as sampler:
        outcomes = asyncio.run(asyncio.wait_for(
            _open_loop(small_server.api_url, OVERLOAD_REQUESTS, OVERLOAD_RATE_PER_S, max_tokens=24),
            timeout=CLIENT_TIMEOUT_S))
    accepted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status in (429, 503)]
    assert len(accepted) + len(refused) == OVERLOAD_REQUESTS, sorted({o.status for o in outcomes})
    assert accepted and refused, (len(accepted), len(refused))
    assert all(o.completion_tokens == 24 for o in accepted)  # every accepted request ran to its end
    assert all(o.retry_after is not None and int(o.retry_after) >= 1 for o in refused)
    assert sampler.max_waiting <= MAX_WAITING
    assert sampler.max_running <= 4
    # Refusals never wait for the engine: measured side by side, they are far quicker than service.
    assert statistics.median(o.latency_s for o in refused) < statistics.median(o.latency_s for o in accepted) / 5
    idle = small_server.wait_idle()
    assert idle.num_kv_blocks_free == idle.num_kv_blocks


# -- disconnect storm --------------------------------------------------------------------------------
STORM_CLIENTS = 60


@pytest.fixture(scope="module")
def storm_server(tiny_loaded: LoadedModel) -> Iterator[LiveServer]:
    """Four sequences run at a time and up to 64 wait: most of the storm leaves from the queue."""
    live = start_server(tiny_engine(tiny_loaded, max_num_seqs=4, host_overhead_ms=2),
                        ServerSettings(max_waiting=64))
    yield live
    stop_server(live)


async def _drop_mid_stream(url: str, index: int) -> str:
    """A client that leaves: before headers, after a few events, or a non-streaming one that times out."""
    rng = random.Random(index)
    body = {"model": MODEL, "prompt": [9, index % 40 + 1, 3], "max_tokens": 500, "ignore_eos": True}
    style = ("early", "mid", "nonstream")[index % 3]
    if style == "nonstream":
        async with httpx.AsyncClient(base_url=url, timeout=rng.uniform(0.05, 0.5)) as client:
            try:
                response = await client.post("/completions", json=body)
            except httpx.TimeoutException:
                return style
            return "refused" if response.status_code == 429 else "completed"
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as client, \
            client.stream("POST", "/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            return "refused"
        if style == "early":
            return style  # gone as soon as the headers came (maybe still queued)
        events = 0
        async for line in response.aiter_lines():
            events += line.startswith("data: ")
            if events >= rng.randint(1, 5):
                break
    return style


def test_a_disconnect_storm_leaks_no_blocks_and_leaves_no_request(storm_server: LiveServer) -> None:
    storm_server.wait_idle()
    async def storm() -> list[str]:
        return await asyncio.gather(*(_drop_mid_stream(storm_server.api_url, i) for i in range(STORM_CLIENTS)))

    styles = asyncio.run(asyncio.wait_for(storm(), timeout=CLIENT_TIMEOUT_S))
    assert styles.count("completed") == 0  # 500 tokens each: nobody could have finished before leaving
    assert styles.count("refused") == 0  # the queue had room for all: every one of them left on its own
    idle = storm_server.wait_idle(timeout_s=30)
    assert (idle.num_running, idle.num_waiting) == (0, 0)
    assert idle.num_kv_blocks_free == idle.num_kv_blocks
    assert storm_server.async_engine._streams == {}  # no request stuck in the server either
    after = httpx.post(f"{storm_server.api_url}/completions", timeout=30,
                       json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True})
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4


# -- KV exhaustion -----------------------------------------------------------------------------------
# 12 blocks of 16 tokens: each request needs up to 5 (a 20-token prompt and 56 new tokens), so at
# most two fit at once while 16 arrive together; the scheduler must preempt and recompute.
KV_BLOCKS = 12
KV_CLIENTS = 16


@pytest.fixture(scope="module")
def starved_server(tiny_loaded: LoadedModel) -> Iterator[LiveServer]:
    live = start_server(tiny_engine(tiny_loaded, num_kv_blocks=KV_BLOCKS, max_num_seqs=8, max_model_len=128),
                        ServerSettings(max_waiting=64))
    yield live
    stop_server(live)


def _kv_body(index: int) -> dict[str, object]:
    prompt = [(index * 7 + k) % 200 + 1 for k in range(20)]
    return {"model": MODEL, "prompt": prompt, "max_tokens": 56, "temperature": 0, "ignore_eos": True}


def test_kv_exhaustion_preempts_and_every_answer_is_the_one_alone(starved_server: LiveServer) -> None:
    with httpx.Client(base_url=starved_server.api_url, timeout=CLIENT_TIMEOUT_S) as client:
        alone = [client.post("/completions", json=_kv_body(i)).json()["choices"][0]["text"] for i in range(KV_CLIENTS)]
    preemptions_before = starved_server.stats().num_preemptions_total

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=starved_server.api_url, timeout=CLIENT_TIMEOUT_S) as client:
            return await asyncio.gather(*(client.post("/completions", json=_kv_body(i)) for i in range(KV_CLIENTS)))

    responses = asyncio.run(asyncio.wait_for(together(), timeout=CLIENT_TIMEOUT_S))
    assert [r.status_code for r in responses] == [200] * KV_CLIENTS
    assert [r.json()["choices"][0]["text"] for r in responses] == alone
    assert starved_server.stats().num_preemptions_total > preemptions_before
    idle = starved_server.wait_idle()
    assert idle.num_kv_blocks_free == idle.num_kv_blocks
