"""Soak: the probed server (what ``diagnose`` runs) under rounds of mixed traffic (streams, plain
requests, clients that drop mid-stream, bad bodies, chat) keeps its memory and file descriptors flat.

Memory and descriptors are read at quiet points (between rounds, the engine idle) with psutil; the
first quiet point after the warm-up is the baseline. ``SERVESCOPE_SOAK_S`` sets the length (the
default run: a short one; ``tox -e soak``: 600 s).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import psutil
import pytest

from loadtests.run.server_process import ServerProcess
from tests.server.conftest import MODEL

SOAK_S = float(os.environ.get("SERVESCOPE_SOAK_S", "20"))
WARMUP_S = min(60.0, max(8.0, SOAK_S / 5))
CLIENTS_PER_ROUND = 12
MAX_RSS_GROWTH = 0.05


@dataclass
class Quiet:
    elapsed_s: float
    rss: int
    fds: int


@dataclass
class Soak:
    samples: list[Quiet] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    rounds: int = 0


@pytest.fixture(scope="module")
def probed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("soak"), ["--model", MODEL, "--execution", "eager",
                                                            "--max-num-seqs", "8", "--num-threads", "1"])
    server.start()
    try:
        server.wait_healthy(120.0)
        yield server
    finally:
        server.stop()


def _gauge(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing from /metrics")


async def _wait_quiet(client: httpx.AsyncClient, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = (await client.get("/metrics")).text
        if _gauge(metrics, "vllm:num_requests_running") == 0 and _gauge(metrics, "vllm:num_requests_waiting") == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError("the server never went idle between rounds")
        await asyncio.sleep(0.05)


async def _one(client: httpx.AsyncClient, rng: random.Random) -> int:
    kind = rng.choice(["stream", "plain", "drop", "bad", "chat"])
    prompt = [rng.randrange(1, 250) for _ in range(rng.randint(1, 60))]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(1, 48), "ignore_eos": True}
    if kind == "bad":
        response = await client.post("/v1/completions", json={**body, "max_tokens": -rng.randint(1, 9)})
        return response.status_code
    if kind == "chat":
        response = await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi " * rng.randint(1, 20)}], "max_tokens": 16})
        return response.status_code
    if kind == "plain":
        return (await client.post("/v1/completions", json=body)).status_code
    async with client.stream("POST", "/v1/completions", json={**body, "max_tokens": 200 if kind == "drop"
                                                              else body["max_tokens"], "stream": True}) as response:
        events = 0
        async for line in response.aiter_lines():
            events += line.startswith("data: ")
            if kind == "drop" and events >= 3:
                return 499  # this client walked away
        return response.status_code


def _read(process: psutil.Process, started: float) -> Quiet:
    """RSS, and the fewest open descriptors over five readings 50 ms apart.

    NOTE: the probes write their files on timers, so one reading can catch a file mid-write; a
    leaked descriptor is there in every reading, a file being written is not.
    """
    fds = []
    for _ in range(5):
        fds.append(process.num_fds())
        time.sleep(0.05)
    return Quiet(time.monotonic() - started, process.memory_info().rss, min(fds))


async def _soak(server: ServerProcess) -> Soak:
    process = psutil.Process(server.pid)
    soak = Soak()
    rng = random.Random(0)
    started = time.monotonic()
    # NOTE: no keep-alive, so the server's socket count at a quiet point does not depend on the pool.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=60.0, limits=limits) as client:
        while time.monotonic() - started < SOAK_S:
            statuses = await asyncio.gather(*(_one(client, rng) for _ in range(CLIENTS_PER_ROUND)))
            for status in statuses:
                soak.statuses[status] = soak.statuses.get(status, 0) + 1
            soak.rounds += 1
            await _wait_quiet(client)
            await asyncio.sleep(0.2)  # closed connections reach the server
            if time.monotonic() - started >= WARMUP_S:
                soak.samples.append(_read(process, started))
    return soak


def test_soak_keeps_memory_and_descriptors_flat(probed_server: ServerProcess) -> None:
    soak = asyncio.run(asyncio.wait_for(_soak(probed_server), timeout=SOAK_S + 300))
    assert set(soak.statuses) <= {200, 400, 499}, soak.statuses
    assert soak.statuses.get(200, 0) > soak.rounds  # real work got done, round after round
    assert len(soak.samples) >= 3, "too short a soak to measure; raise SERVESCOPE_SOAK_S"
    baseline, last = soak.samples[0], soak.samples[-1]
    growth = last.rss / baseline.rss - 1
    print(f"soak: {soak.rounds} rounds in {last.elapsed_s:.0f} s, statuses {soak.statuses}; RSS "
          f"{baseline.rss / 2**20:.1f} -> {last.rss / 2**20:.1f} MiB ({growth:+.2%}); fds {baseline.fds} -> {last.fds}")
    assert growth < MAX_RSS_GROWTH, [s.rss for s in soak.samples]
    assert last.fds <= baseline.fds, [s.fds for s in soak.samples]
