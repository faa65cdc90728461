"""``summary.json``: every load point's measures, the one set the console, the report and the verdict read.

Each point's directory is loaded once (:class:`~reports.dataset.RunDataset`) and measured once
(:func:`point_measures`); the terminal table of ``servescope load``/``diagnose``, ``report.html``
and ``diagnosis.json`` all show these same objects, so they cannot disagree on a run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from probes.run_dir import LoadWorker
from reports.dataset import RunDataset
from reports.measures import (
    ClientMeasures,
    OpenLoopMeasures,
    ServerMeasures,
    client_measures,
    open_loop_measures,
    server_measures,
)
from reports.metric_adapters import PrometheusMeasures, finished_requests, prometheus_measures


@dataclass(slots=True)
class Accounting:
    """Requests as each side counted them, warm-up included: client rows, Locust's HTTP rows, the server."""

    client_rows: int | None
    locust_http_requests: int | None
    locust_http_failures: int | None
    server_finished_requests: int | None

    @property
    def is_consistent(self) -> bool:
        counts = {c for c in (self.client_rows, self.locust_http_requests, self.server_finished_requests)
                  if c is not None}
        return len(counts) <= 1

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "is_consistent": self.is_consistent}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Accounting:
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})


# When the load generator may be what limits a run (a client that is the bottleneck reads the
# server's timing late; see loadtests.client.health):
CLIENT_CPU_LIMIT = 0.9  # a worker's median CPU over the measured window, as a share of one core
CLIENT_LOOP_LAG_LIMIT_S = 0.010  # a worker's event loop waking this late at p95: near what it can drive
OPEN_LOOP_LAG_LIMIT_S = 0.050  # open-loop sends this far behind their schedule at p95
MIN_HEALTH_SAMPLES = 3  # fewer samples in the window say nothing


@dataclass(slots=True)
class WorkerHealth:
    """One load worker process over the measured window: its CPU, its event loop's lag, what it received."""

    worker: str
    num_samples: int
    cpu_share_p50: float  # of one core
    cpu_share_max: float
    loop_lag_p50_s: float
    loop_lag_p95_s: float
    loop_lag_max_s: float
    chunks_per_s: float | None  # content chunks this worker received per second
    requests_per_s: float | None  # requests it finished per second

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class RunWarning:
    """Something that makes a run's client-side figures suspect, measured; ``kind`` names the check."""

    kind: str  # client_cpu, client_ceiling, open_loop_lag or lost_worker
    message: str
    value: float
    limit: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class PointMeasures:
    """One load point: what it was, and everything measured of it."""

    label: str
    concurrency: float | None  # closed-loop users, else the open-loop rate
    load: dict[str, Any]  # the point's settings (LoadConfig.to_dict())
    target: str | None
    model: str | None
    num_warmup_requests: int
    client: ClientMeasures | None
    server: ServerMeasures | None
    prometheus: PrometheusMeasures | None
    open_loop: OpenLoopMeasures | None
    accounting: Accounting
    workers: list[WorkerHealth] = dataclasses.field(default_factory=list)
    warnings: list[RunWarning] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "concurrency": self.concurrency, "load": self.load, "target": self.target,
            "model": self.model, "num_warmup_requests": self.num_warmup_requests,
            **{name: (part.to_dict() if part is not None else None) for name, part in (
                ("client", self.client), ("server", self.server), ("prometheus", self.prometheus),
                ("open_loop", self.open_loop))},
            "accounting": self.accounting.to_dict(),
            "workers": [w.to_dict() for w in self.workers], "warnings": [w.to_dict() for w in self.warnings],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PointMeasures:
        def part(kind: Any, value: dict[str, Any] | None) -> Any:
            return None if value is None else kind(**value)

        return cls(label=data["label"], concurrency=data["concurrency"], load=dict(data["load"]),
                   target=data["target"], model=data["model"], num_warmup_requests=data["num_warmup_requests"],
                   client=part(ClientMeasures, data["client"]), server=part(ServerMeasures, data["server"]),
                   prometheus=part(PrometheusMeasures, data["prometheus"]),
                   open_loop=part(OpenLoopMeasures, data["open_loop"]),
                   accounting=Accounting.from_dict(data["accounting"]),
                   workers=[WorkerHealth(**w) for w in data.get("workers", [])],
                   warnings=[RunWarning(**w) for w in data.get("warnings", [])])


@dataclass(slots=True)
class RunSummary:
    """``summary.json``: a run's points (one, or a sweep's in order of load) and what the sweep varies."""

    sweep_parameter: str | None
    points: list[PointMeasures]

    def to_dict(self) -> dict[str, Any]:
        return {"sweep_parameter": self.sweep_parameter, "points": [p.to_dict() for p in self.points]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        return cls(data.get("sweep_parameter"), [PointMeasures.from_dict(p) for p in data["points"]])


def point_measures(data: RunDataset) -> PointMeasures:
    """Every measure of one loaded point."""
    client, open_loop, server = client_measures(data), open_loop_measures(data), server_measures(data)
    prometheus = prometheus_measures(data)
    workers = worker_health(data)
    rows = data.client
    return PointMeasures(
        label=data.label, concurrency=data.concurrency, load=dict(data.load_config),
        target=data.load_info.target if data.load_info is not None else None, model=data.model,
        num_warmup_requests=int(rows["is_warmup"].sum()) if rows is not None else 0,
        client=client, server=server, prometheus=prometheus,
        open_loop=open_loop, accounting=accounting(data), workers=workers,
        warnings=[*client_warnings(workers, open_loop, int(data.load_config.get("processes") or len(workers) or 1)),
                  *lost_worker_warnings(data.load_info.lost_workers if data.load_info is not None else [])],
    )


def worker_health(data: RunDataset) -> list[WorkerHealth]:
    """Each load worker's health samples inside the measured window, with what it received there."""
    samples = data.client_health
    start, end = data.window
    if samples is None or not np.isfinite(start) or not np.isfinite(end) or end <= start:
        return []
    inside = samples[(samples["time"] >= start) & (samples["time"] <= end)]
    rows = data.client[~data.client["is_warmup"]] if data.client is not None else None
    out = []
    for worker, own in inside.groupby("worker", sort=True):
        if len(own) < MIN_HEALTH_SAMPLES:
            continue
        chunks = requests = None
        if rows is not None:
            mine = rows[rows["worker"] == worker]
            times = np.concatenate([np.asarray(t, dtype="float64") for t in mine["token_times"]] or [np.empty(0)])
            chunks = float(((times >= start) & (times <= end)).sum()) / (end - start)
            requests = float(mine["end_time"].between(start, end).sum()) / (end - start)
        cpu, lag = own["cpu_share"], own["loop_lag_s"]
        out.append(WorkerHealth(worker=str(worker), num_samples=len(own), cpu_share_p50=float(cpu.median()),
                                cpu_share_max=float(cpu.max()), loop_lag_p50_s=float(lag.median()),
                                loop_lag_p95_s=float(np.percentile(lag, 95)), loop_lag_max_s=float(lag.max()),
                                chunks_per_s=chunks, requests_per_s=requests))
    return out


def client_warnings(workers: list[WorkerHealth], open_loop: OpenLoopMeasures | None,
                    num_processes: int) -> list[RunWarning]:
    """What makes this point's client-side figures suspect: a busy or lagging worker, a late open loop."""
    out = []
    for w in workers:
        if w.cpu_share_p50 > CLIENT_CPU_LIMIT:
            out.append(RunWarning(
                "client_cpu", f"load worker {w.worker} kept {w.cpu_share_p50:.0%} of a CPU core busy (median over "
                f"the measured window, above {CLIENT_CPU_LIMIT:.0%}): the client may be what limits this run; "
                f"try --processes {num_processes + 1} or a client on another machine", w.cpu_share_p50,
                CLIENT_CPU_LIMIT))
        if w.loop_lag_p95_s > CLIENT_LOOP_LAG_LIMIT_S:
            rate = f" while receiving {w.chunks_per_s:.0f} chunks/s" if w.chunks_per_s is not None else ""
            out.append(RunWarning(
                "client_ceiling", f"load worker {w.worker} is near what one process can drive: its event loop woke "
                f"{w.loop_lag_p95_s * 1000:.0f} ms late at p95 (above {CLIENT_LOOP_LAG_LIMIT_S * 1000:.0f} ms)"
                f"{rate}, so its token times (TTFT, ITL) may read late by as much; spread the load over more "
                f"--processes", w.loop_lag_p95_s, CLIENT_LOOP_LAG_LIMIT_S))
    lag = open_loop.send_lag_s if open_loop is not None else None
    if lag is not None and lag["p95"] > OPEN_LOOP_LAG_LIMIT_S:
        out.append(RunWarning(
            "open_loop_lag", f"open-loop arrivals fell behind their schedule: sends were {lag['p95'] * 1000:.0f} ms "
            f"late at p95 (above {OPEN_LOOP_LAG_LIMIT_S * 1000:.0f} ms), so the offered rate was not the rate "
            f"sent", lag["p95"], OPEN_LOOP_LAG_LIMIT_S))
    return out


def lost_worker_warnings(lost: list[LoadWorker]) -> list[RunWarning]:
    """A load worker that dropped out mid-run: its rows so far are in, what it had in flight is not."""
    return [RunWarning(
        "lost_worker", f"load worker {w.worker} ({w.node}) was lost mid-run: it {w.lost}; {w.num_rows} of its "
        f"requests were recorded, and at least {w.num_unrecorded} more it had sent were not (those in flight at its "
        f"last message); the load after that came from the other workers only", float(w.num_unrecorded), 0.0) for w in lost]


def accounting(data: RunDataset) -> Accounting:
    stats = data.locust_stats
    http = stats[stats["Type"] == "POST"] if stats is not None else None
    if "requests" in data.frames:
        finished = int(data.frames["requests"]["is_finished"].sum())
    else:
        finished = finished_requests(data)
    return Accounting(
        client_rows=len(data.client) if data.client is not None else None,
        locust_http_requests=int(http["Request Count"].sum()) if http is not None else None,
        locust_http_failures=int(http["Failure Count"].sum()) if http is not None else None,
        server_finished_requests=finished,
    )
