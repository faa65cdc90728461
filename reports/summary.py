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
import pandas as pd

from reports.dataset import RunDataset
from reports.measures import (
    ClientMeasures,
    PrometheusMeasures,
    ServerMeasures,
    client_measures,
    distribution,
    metrics_adapter,
    prometheus_measures,
    server_measures,
)


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


@dataclass(slots=True)
class OpenLoopMeasures:
    """Whether an open-loop generator kept to its schedule."""

    offered_rate_per_s: float | None
    achieved_send_rate_per_s: float
    send_lag_s: dict[str, float] | None  # send time - scheduled time

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "concurrency": self.concurrency, "load": self.load, "target": self.target,
            "model": self.model, "num_warmup_requests": self.num_warmup_requests,
            **{name: (part.to_dict() if part is not None else None) for name, part in (
                ("client", self.client), ("server", self.server), ("prometheus", self.prometheus),
                ("open_loop", self.open_loop))},
            "accounting": self.accounting.to_dict(),
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
                   accounting=Accounting.from_dict(data["accounting"]))


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
    client = data.client
    return PointMeasures(
        label=data.label, concurrency=data.concurrency, load=dict(data.load_config),
        target=data.load_info.target if data.load_info is not None else None, model=data.model,
        num_warmup_requests=int(client["is_warmup"].sum()) if client is not None else 0,
        client=client_measures(data), server=server_measures(data), prometheus=prometheus_measures(data),
        open_loop=open_loop_measures(data), accounting=accounting(data),
    )


def open_loop_measures(data: RunDataset) -> OpenLoopMeasures | None:
    """Offered against achieved send rate and the send lag, for an open-loop point with client rows."""
    if data.load_config.get("mode") != "open" or data.client is None:
        return None
    measured = data.client[~data.client["is_warmup"]]
    if len(measured) < 2:
        return None
    sends = np.sort(measured["send_time"].to_numpy())
    return OpenLoopMeasures(
        offered_rate_per_s=data.load_config.get("rate"),
        achieved_send_rate_per_s=(len(sends) - 1) / float(sends[-1] - sends[0]),
        send_lag_s=distribution(measured["send_time"] - measured["scheduled_time"]),
    )


def accounting(data: RunDataset) -> Accounting:
    stats = data.locust_stats
    http = stats[stats["Type"] == "POST"] if stats is not None else None
    finished = None
    if "requests" in data.frames:
        finished = int(data.frames["requests"]["is_finished"].sum())
    elif (adapter := metrics_adapter(data)) is not None:
        present = set(data.frame("prometheus")["sample"].unique())
        counter = adapter.first_present(adapter.finished, present)
        finished = _counter_growth(data.frame("prometheus"), counter) if counter is not None else None
    return Accounting(
        client_rows=len(data.client) if data.client is not None else None,
        locust_http_requests=int(http["Request Count"].sum()) if http is not None else None,
        locust_http_failures=int(http["Failure Count"].sum()) if http is not None else None,
        server_finished_requests=finished,
    )


def _counter_growth(frame: pd.DataFrame, sample: str) -> int | None:
    """How much counter ``sample`` (summed over labels) grew from the first scrape to the last.

    NOTE: a labelled counter has no sample until its first increment, so a scrape without it counts 0.
    """
    rows = frame[frame["sample"] == sample]
    if rows.empty:
        return None
    scrapes = sorted(frame["scrape_index"].unique())
    per_scrape = rows.groupby("scrape_index")["value"].sum().reindex(scrapes, fill_value=0.0)
    return int(round(per_scrape.iloc[-1] - per_scrape.iloc[0]))
