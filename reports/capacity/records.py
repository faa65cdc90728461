"""A capacity search's records: what the search ran (``capacity.json``) and the capacity it found.

The search (loadtests.capacity) writes ``capacity.json`` (:class:`CapacitySearch`: the points in
the order it ran them, why it stopped, the tokens experiment) beside the sweep's ``sweep.json``;
reports.capacity.result reads the points back into a :class:`Capacity` (``diagnosis.json``'s ``capacity``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from probes.run_dir import CAPACITY_NAME, RunDirectory
from reports.capacity.interval import RateInterval
from reports.capacity.knee import KneeFit

# Default share of requests that must meet every SLO bound for a point to hold.
SLO_ATTAINMENT = 0.9
Limit = Literal["serial", "seats", "memory", "compute"]


@dataclass(slots=True)
class CapacitySearch:
    """What the search ran (``capacity.json``); the measures themselves are in each point's directory."""

    order: list[int]  # users of each point, in the order they ran
    stopped: str  # why the search stopped doubling
    slo_attainment: float = SLO_ATTAINMENT
    tokens_dir: str | None = None  # the tokens experiment's run directory, relative to the search's
    tokens_scale: float | None = None  # how many times the tokens per request it asked for
    model_bytes: int | None = None  # the served model's weight bytes, when given or known
    is_local: bool = False  # the target runs on this machine (its memory bandwidth is ours)
    probed: bool = False  # the engine's probes watched the search (diagnose): they, not experiments, tell the limit
    overloaded: list[dict[str, Any]] = field(default_factory=list)  # points that measured nothing: overloaded
    # The point where requests began to fail from overload (reports.failures): users, dir, why. It stays
    # in the sweep: its failures are the evidence of the limit, and the search stopped there.
    failed_at: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacitySearch:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclass(slots=True)
class CapacityPoint:
    """One point of the search as the capacity reads it."""

    users: int
    output_tokens_per_s: float | None  # tokens streamed inside the measured window / its length
    decoding_streams: float | None  # requests between first token and end, time-averaged over the window
    in_flight: float | None  # requests between send and end, time-averaged over the window
    tokens_per_request: float | None  # mean prompt + output tokens of the measured requests
    slo_attainment: dict[str, float] | None = None  # value, low, high (95% Wilson)
    goodput: float | None = None  # good requests / s
    output_tokens_per_s_interval: dict[str, float | int] | None = None  # RateInterval.to_dict()
    measured_s: float | None = None  # the measured window's length
    window: dict[str, Any] | None = None  # a controlled point's decisions (loadtests.point_stop.PointWindow)
    other_cpu_cores: float | None = None  # cores other processes took during the window (reports.capacity.other_load)
    # The engine's decode forwards over its step calibration in the window, and that over the search's median
    # point (reports.levers.engine_speed: engine_load_factor, slowdowns); filled where the engine was probed.
    engine_load_factor: float | None = None
    engine_slowdown: float | None = None

    @property
    def interval(self) -> RateInterval | None:
        i = self.output_tokens_per_s_interval
        return RateInterval.from_dict(i) if i is not None else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class TokensExperiment:
    """The knee point rerun with more tokens per request: does the number of decoding streams hold?"""

    users: int
    token_ratio: float  # tokens per request, experiment / base (measured)
    streams_ratio: float  # decoding streams, experiment / base
    exponent: float  # log(1/streams_ratio) / log(token_ratio): 0 holds the count (seats), 1 proportional (memory)
    limit: Limit

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class Capacity:
    """``diagnosis.json``'s ``capacity``: where the server saturates, and the evidence."""

    concurrency: int | None
    output_tokens_per_s: float | None
    goodput: float | None
    method: str  # slo, plateau, or undetermined (the points cannot be told apart)
    reason: str  # the capacity in words
    limit: Limit | None
    limit_evidence: str
    knee: KneeFit
    points: list[CapacityPoint]
    stopped: str
    past_knee_users: int | None = None  # the point past the capacity where its limit binds
    serial_gain: float | None = None  # the best throughput at more than 1 user / at 1
    max_decoding_streams: float | None = None  # the most streams decoding at once (time-averaged) at any point
    failed_at_users: int | None = None  # where requests began to fail from overload (the search stopped there)
    queue_share_past_knee: float | None = None  # decoding streams / open requests past the knee
    tokens: TokensExperiment | None = None
    probed: bool = False  # the engine's probes watched the search, so they tell the limit
    single_stream: dict[str, Any] | None = None  # TPOT at 1 user against weight bytes / bandwidth
    slo: dict[str, Any] = field(default_factory=dict)
    interval: dict[str, Any] | None = None  # the capacity's range in users (CapacityInterval.to_dict())
    output_tokens_per_s_interval: dict[str, float | int] | None = None  # the capacity point's RateInterval
    saturation_tokens_per_s: float | None = None  # the level the curve saturates at (reports.capacity.saturation)
    saturation_tokens_per_s_interval: dict[str, float] | None = None  # its bootstrap interval (value, low, high)

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if f.name not in ("knee", "points", "tokens")},
                "knee": self.knee.to_dict(), "points": [p.to_dict() for p in self.points],
                "tokens": self.tokens.to_dict() if self.tokens is not None else None}


def read_search(path: str | Path) -> CapacitySearch | None:
    return RunDirectory(path).load(CAPACITY_NAME, CapacitySearch)

