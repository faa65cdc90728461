"""Drive a real engine in-process under timed load and write a complete run directory.

What ``servescope diagnose`` writes, without HTTP or Locust in the loop: the probes (a real
:class:`~probes.session.ProbeSession` on the engine), ``client_requests.parquet`` with one row
per request as this driver (the client) saw it, ``load.json``, ``workload.jsonl`` and
``machine_peaks.json``; or, for an "external" server, only what its clients see. Arrivals are
closed loop (N users, each with a think time) or open loop (seeded Poisson arrivals). Every loop
is bounded by a deadline.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.baselines import NaiveEngine, StaticBatchEngine
from engine.weights import LoadedModel, load_model
from loadtests.client.records import ClientRecord
from loadtests.client.table import records_table
from loadtests.config import LoadConfig
from loadtests.plan import PlannedRequest, write_plan
from loadtests.run.execution_reference import measure_reference
from loadtests.workloads.catalog import make_workload
from probes.base import Probe
from probes.execution_variants import execution_variants
from probes.host import HostProbe
from probes.manifest import RunManifest
from probes.peaks import MachinePeaks, measure_peaks
from probes.prometheus import PrometheusProbe
from probes.run_dir import (
    CALIBRATION_NAME,
    CLIENT_TABLE,
    LOAD_NAME,
    PLAN_NAME,
    SWEEP_NAME,
    LoadInfo,
    RunDirectory,
    SweepIndex,
    SweepPoint,
)
from probes.session import ProbeSession
from probes.step_calibration import measure_calibration

ENGINE_KINDS = ("continuous", "static", "naive")
# Seconds in-flight requests get to finish after the load stops before they are aborted.
DRAIN_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class Load:
    """The offered load: ``users`` closed-loop users (with ``think_s`` between requests) or ``rate`` req/s."""

    users: int | None = None
    rate: float | None = None
    think_s: float = 0.0
    duration_s: float = 2.5
    warmup_s: float = 0.5
    workload: str = "fixed"
    workload_args: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    slo: Mapping[str, float] = field(default_factory=dict)
    prompts: tuple[tuple[str, int], ...] = ()  # (text, max_tokens) sent as the first requests (e.g. markup)

    def load_config(self) -> LoadConfig:
        return LoadConfig(users=self.users, rate=self.rate, duration_s=self.duration_s, warmup_s=self.warmup_s,
                          workload=self.workload, seed=self.seed, slo=dict(self.slo))


@cache
def shared_model(name: str) -> LoadedModel:
    return load_model(name)


@cache
def shared_peaks() -> MachinePeaks:
    """Measured once per test session; every run directory gets the same measurement."""
    # NOTE: float32 on one thread, as build_engine runs every engine; before the first load.
    return measure_peaks("cpu", "float32", matmul_n=1024, repeats=3, dtypes=("float32",), num_threads=1)


def build_engine(kind: str, engine: Mapping[str, Any]) -> Any:
    # NOTE: one torch thread: on a small shared machine torch's default pool oversubscribes the cores
    # and a dummy:tiny step takes ten times longer, with a noisy spread.
    config = EngineConfig(**{"model": "dummy:tiny", "device": "cpu", "num_threads": 1, **engine})
    loaded = shared_model(config.model)
    if kind == "continuous":
        return LLMEngine(config, loaded)
    if kind == "static":
        return StaticBatchEngine(config, loaded)
    if kind == "naive":
        return NaiveEngine(config, loaded)
    raise ValueError(f"unknown engine kind {kind!r}; known: {ENGINE_KINDS}")


def make_plan(engine: Any, load: Load, size: int = 256) -> list[PlannedRequest]:
    workload = make_workload(load.workload, **dict(load.workload_args))
    items = workload.items(size, engine.tokenizer, load.seed)
    plan = [PlannedRequest(i, it.prompt, len(it.prompt_token_ids), it.max_tokens, it.group)
            for i, it in enumerate(items)]
    for i, (text, max_tokens) in enumerate(load.prompts):
        plan[i] = PlannedRequest(i, text, len(engine.tokenizer.encode(text)), max_tokens)
    return plan


def run(out: Path, load: Load, engine: Mapping[str, Any] | None = None, kind: str = "continuous",
        external: bool = False, metrics: bool = False, time_paths: bool = False,
        execution_levers: bool = False) -> Path:
    """One load point into ``out``.

    ``external`` records only what a client of someone else's server has (client rows, this
    host), plus, with ``metrics``, the engine's own Prometheus ``/metrics`` scraped over HTTP.
    With ``time_paths``, as ``servescope diagnose`` and ``load`` do: before the load the step
    calibration (engine runs: both execution paths at several decode batch sizes), and after it
    the optimized path on the batch the client saw (runs with client rows); with ``execution_levers`` the
    calibration times every execution lever of this device too (dtype, quantized weights, attention backend).
    """
    built = build_engine(kind, engine or {})
    plan = make_plan(built, load)
    run_dir = RunDirectory.create(out)
    if time_paths and kind == "continuous" and not external:
        context = round(statistics.median(p.num_prompt_tokens + p.max_tokens / 2 for p in plan))
        variants = execution_variants(built.config, built.config.torch_device)
        if not execution_levers:  # NOTE: the execution path alone keeps the default test run quick
            variants = [v for v in variants if set(v.changes) == {"execution"}]
        run_dir.save(CALIBRATION_NAME, measure_calibration(shared_model(built.config.model), built.config, context,
                                                           repeats=2, variants=variants))
    write_plan(out / PLAN_NAME, plan)
    config = load.load_config()
    info = {"config": config.to_dict(), "server": "external" if external else "in-process",
            "model": built.model_name, "engine": kind}
    endpoint = MetricsEndpoint(built) if metrics else None
    try:
        session = _session(run_dir, built, info, load, external, endpoint)
        session.start()
        error: BaseException | None = None
        try:
            records = _drive(built, plan, load, endpoint)
        except BaseException as exc:
            error = exc
            raise
        finally:
            session.stop(error=error)
    finally:
        if endpoint is not None:
            endpoint.close()
    run_dir.write_table(CLIENT_TABLE, records_table(records))
    run_dir.save(LOAD_NAME, LoadInfo(config=info["config"], server=info["server"], model=info["model"],
                                     target="in-process"))
    if time_paths and kind == "continuous":
        config = built.config
        measure_reference(out, config.model, lambda batch, context: engine_step(built, batch, context),
                          num_threads=config.num_threads)
    return out


def engine_step(engine: Any, batch: int, context: int) -> Any:
    """The in-process server's decode step as its client would time it: ``batch`` streams of ``context`` tokens.

    The load is over and its probes are detached; the requests are added here and stepped into
    decode, and each call times one more step (the longest output any call sequence needs is given).
    """
    vocab = engine.model_config.vocab_size
    for i in range(batch):
        prompt = [(5 * i + 11 * j) % (vocab - 1) + 1 for j in range(context)]
        engine.add_request(prompt, SamplingParams(max_tokens=64, ignore_eos=True), request_id=f"reference-{i}")
    started: set[str] = set()
    for _ in range(64):  # NOTE: bounded; a pool too small for the batch decodes whatever fits
        started.update(out.request_id for out in engine.step() if out.token_ids)
        if len(started) >= batch:
            break
    engine.step()

    def one_step() -> float:
        start = time.perf_counter()
        engine.step()
        return time.perf_counter() - start

    return one_step


def _session(run_dir: RunDirectory, engine: Any, info: dict[str, Any], load: Load, external: bool,
             endpoint: MetricsEndpoint | None) -> ProbeSession:
    seeds = {"workload": load.seed}
    if not external:
        run_dir.write_peaks(shared_peaks())
        return ProbeSession.for_engine(engine, run_dir.path, workload=info, seeds=seeds,
                                       prometheus_url=endpoint.url if endpoint else None,
                                       host_interval_s=0.25, nvml_interval_s=1.0)
    probes: list[Probe] = [HostProbe(run_dir, 0.25)]
    if endpoint is not None:
        probes.append(PrometheusProbe(run_dir, endpoint.url, interval_s=0.1))
    manifest = RunManifest.collect(model=engine.model_name, workload=info, seeds=seeds)
    return ProbeSession(run_dir, probes, manifest)


def run_sweep(out: Path, users: Sequence[int], load: Load, engine: Mapping[str, Any] | None = None,
              kind: str = "continuous", external: bool = False, metrics: bool = False) -> Path:
    """A closed-loop sweep over ``users``, laid out as the orchestrator lays one out (``sweep.json``)."""
    out.mkdir(parents=True)
    points = []
    for n in users:
        point = dataclasses.replace(load, users=n, rate=None)
        name = point.load_config().point_name
        run(out / name, point, engine, kind, external, metrics)
        points.append(SweepPoint(float(n), name))
    RunDirectory(out).save(SWEEP_NAME, SweepIndex("users", points))
    return out


class MetricsEndpoint:
    """The engine's own ``/metrics`` (engine.server.metrics) on a free loopback port, fed a stats snapshot.

    NOTE: the driver refreshes the snapshot after every step on its own thread, as the server's
    engine thread does, so the scrape thread never touches the engine.
    """

    def __init__(self, engine: Any) -> None:
        from prometheus_client import start_http_server

        from engine.server.metrics import ServerMetrics

        self.snapshot = engine.stats()
        self.metrics = ServerMetrics(engine.model_name, lambda: self.snapshot)
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=self.metrics.registry)
        self.url = f"http://127.0.0.1:{self._server.server_port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _drive(engine: Any, plan: list[PlannedRequest], load: Load, endpoint: MetricsEndpoint | None) -> list[ClientRecord]:
    rng = random.Random(load.seed)
    start = time.time()
    warmup_end = start + load.warmup_s
    stop_sending = warmup_end + load.duration_s
    deadline = stop_sending + DRAIN_TIMEOUT_S
    records: dict[str, ClientRecord] = {}
    owner: dict[str, int] = {}
    user_ready = [start + i * 0.01 for i in range(load.users or 0)]
    user_busy = [False] * len(user_ready)
    next_arrival = start + (rng.expovariate(load.rate) if load.rate else float("inf"))
    counter = 0
    finished: list[ClientRecord] = []

    def send(now: float, scheduled: float | None, user: int | None) -> None:
        nonlocal counter
        item = plan[counter % len(plan)]
        rid = f"r{counter}"
        record = ClientRecord(worker="inproc-0", seq=counter, plan_index=item.index, group=item.group,
                              is_warmup=now < warmup_end, send_time=now, scheduled_time=scheduled,
                              planned_prompt_tokens=item.num_prompt_tokens, max_tokens=item.max_tokens)
        engine.add_request(engine.tokenizer.encode(item.prompt), SamplingParams(max_tokens=item.max_tokens,
                                                                                ignore_eos=True), request_id=rid)
        records[rid] = record
        if user is not None:
            owner[rid] = user
            user_busy[user] = True
        counter += 1

    while True:
        now = time.time()
        if now > deadline:
            for rid in list(records):
                engine.abort(rid)
                records.pop(rid).error = "aborted: the drain timed out"
            break
        if now < stop_sending:
            for user, ready in enumerate(user_ready):
                if not user_busy[user] and now >= ready:
                    send(now, None, user)
            while next_arrival <= now:
                send(now, next_arrival, None)
                next_arrival += rng.expovariate(load.rate)  # type: ignore[arg-type]
        if engine.has_unfinished():
            outputs = engine.step()
            now = time.time()
            if endpoint is not None:
                endpoint.snapshot = engine.stats()
            for out in outputs:
                record = records[out.request_id]
                record.token_times.append(now)
                if record.first_token_time is None:
                    record.first_token_time = record.first_byte_time = now
                if out.finished:
                    record.end_time = now
                    record.status_code = 200
                    record.finish_reason = out.finish_reason
                    record.request_id = out.request_id
                    record.num_prompt_tokens = len(out.prompt_token_ids)
                    record.num_output_tokens = len(out.token_ids)
                    record.num_cached_tokens = out.num_cached_tokens
                    record.has_usage = True
                    finished.append(records.pop(out.request_id))
                    user = owner.pop(out.request_id, None)
                    if user is not None:
                        user_busy[user] = False
                        user_ready[user] = now + load.think_s
        elif now >= stop_sending:
            break
        else:
            upcoming = [r for u, r in enumerate(user_ready) if not user_busy[u]] + [next_arrival, stop_sending]
            time.sleep(min(max(min(upcoming) - now, 0.0), 0.05))
    return sorted(finished + list(records.values()), key=lambda r: r.send_time)
