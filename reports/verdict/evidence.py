"""What a diagnosis rests on: one :class:`Evidence` per rule, and the rule base class (every rule: reports.verdict.rules)."""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from probes.execution_paths import PathTiming
from probes.server_info import ServerInfo
from reports.measures import ClientMeasures, ServerMeasures
from reports.metric_adapters import PrometheusMeasures
from reports.roofline import RooflineSummary

if TYPE_CHECKING:
    from reports.capacity.records import Capacity
    from reports.failures import FailureCounts

Bottleneck = Literal["batching", "cache", "execution", "none"]
BATCHING: Bottleneck = "batching"
CACHE: Bottleneck = "cache"
EXECUTION: Bottleneck = "execution"
NONE: Bottleneck = "none"  # nothing inside the server binds: the offered load is the limit
BOTTLENECKS: tuple[Bottleneck, ...] = (BATCHING, CACHE, EXECUTION, NONE)
# What a run gets instead of a bottleneck when it cannot be judged (reports.health).
NO_VERDICT = "undetermined"
Comparison = Literal[">=", "<="]


@dataclass(slots=True)
class Evidence:
    """One figure of the run against its threshold, and why the threshold sits there.

    ``passed`` is None when the run does not hold what the rule needs (no KV pool, no peaks...).
    """

    name: str
    bottleneck: Bottleneck
    value: float | None
    threshold: float
    comparison: Comparison
    passed: bool | None
    summary: str  # the figure in words, e.g. "requests waited in 97% of the busy time"
    why: str  # why the threshold is where it is

    @property
    def margin(self) -> float:
        """How far past its threshold the value is, relative to the threshold (0 when not passed)."""
        if not self.passed or self.value is None or self.threshold == 0:
            return 0.0
        ratio = self.value / self.threshold if self.comparison == ">=" else self.threshold / max(self.value, 1e-12)
        return max(0.0, min(ratio - 1.0, 1.0)) if math.isfinite(ratio) else 1.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evidence:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


@dataclass(slots=True)
class SweepMeasures:
    """How the client-side figures move from the lightest to the heaviest point of a concurrency sweep."""

    parameter: str
    low: float
    high: float
    throughput_ratio: float | None  # output tok/s at the heaviest point / at the lightest
    ttft_ratio: float | None  # median TTFT, heaviest / lightest
    tpot_ratio: float | None  # median TPOT, heaviest / lightest

    @property
    def load_ratio(self) -> float:
        return self.high / self.low if self.low else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "load_ratio": self.load_ratio}


@dataclass(slots=True)
class Facts:
    """Everything the rules may read about one load point (and, for a sweep, how the points compare)."""

    server: ServerMeasures | None
    client: ClientMeasures | None
    prometheus: PrometheusMeasures | None
    roofline: RooflineSummary | None
    engine_config: dict[str, Any] = field(default_factory=dict)
    sweep: SweepMeasures | None = None
    is_metrics_unread: bool = False  # /metrics was scraped but no adapter knows its names
    capacity: Capacity | None = None  # after a capacity search: its experiments (reports.verdict.capacity_rules)
    execution_paths: PathTiming | None = None  # the run's path against the optimized one (engine runs)
    execution_reference: PathTiming | None = None  # the optimized path on the client's batch (outside view)
    failures: FailureCounts | None = None  # the point's failed requests by kind (reports.failures)
    # Median TPOT of one stream alone, in the same run: a capacity search's 1-user point, a sweep's, or the
    # single-stream reference a one-point run takes after its load (probes.single_stream).
    single_stream_tpot_s: float | None = None
    server_info: ServerInfo | None = None  # what the server said of itself (llama-server's /props and /slots)


class Rule(ABC):
    """A named test of one figure against a threshold; subclasses set the class attributes and :meth:`value`."""

    name: ClassVar[str]
    bottleneck: ClassVar[Bottleneck]
    threshold: ClassVar[float]
    comparison: ClassVar[Comparison] = ">="
    why: ClassVar[str]

    def evaluate(self, facts: Facts) -> Evidence:
        value = self.value(facts)
        passed = None if value is None else (value >= self.threshold if self.comparison == ">="
                                             else value <= self.threshold)
        return Evidence(self.name, self.bottleneck, value, self.threshold, self.comparison, passed,
                        self.describe(facts, value), self.why)

    @abstractmethod
    def value(self, facts: Facts) -> float | None:
        """The figure this rule tests, or None when the run cannot tell."""

    @abstractmethod
    def describe(self, facts: Facts, value: float | None) -> str:
        """The figure in words (shown next to its threshold)."""


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 10 ** digits else f"{value:.{digits}g}"
