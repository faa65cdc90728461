"""How sure a capacity is: the same choice made again on every point's throughput redrawn within its noise.

Each point of a search measured its output tokens/s with a batch-means interval
(:mod:`reports.capacity.interval`). A parametric bootstrap redraws every point at once, each from a
Student t around its value with its own standard error and degrees of freedom, and makes the
capacity choice again on the redrawn curve (``reports.capacity.saturation``). The
capacity's interval is the range the central ``confidence`` of those choices fall in, in measured
users. When that range spans more than ``MAX_SPREAD`` (in users, high over low), the points cannot
be told apart well enough to name a capacity, and the result says so instead of picking one. The
saturation throughput's interval is the central ``confidence`` of the same redrawn curves' levels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from reports.capacity.interval import CONFIDENCE, RateInterval, student_t_quantile
from reports.capacity.saturation import choose_users, precision_weights, saturation_throughput

NUM_RESAMPLES = 400
# The capacity is not named when its interval's high end is more than this many times its low end:
# two doublings of the search (8 against 32 users) is a range the points did not narrow down.
MAX_SPREAD = 4.0
SEED = 0  # NOTE: fixed, so one search's interval is the same on every rereading of its run directory

Choose = Callable[[list[int], list[float]], int | None]  # the capacity of one curve (users, tok/s) in users


@dataclass(frozen=True, slots=True)
class CapacityInterval:
    """The range of users the capacity falls in at ``confidence``, and how often the estimate itself was chosen."""

    low: int
    high: int
    confidence: float
    share_at_estimate: float  # share of the redrawn curves that chose the same capacity as the measured one
    num_resamples: int
    is_told_apart: bool  # False: the range spans more than MAX_SPREAD; no capacity is named

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityInterval:
        return cls(int(data["low"]), int(data["high"]), float(data["confidence"]), float(data["share_at_estimate"]),
                   int(data["num_resamples"]), bool(data["is_told_apart"]))


def standard_error(interval: RateInterval) -> tuple[float, int]:
    """The standard error behind a batch-means interval and its degrees of freedom."""
    dof = interval.dof
    return interval.half_width / student_t_quantile(0.5 + interval.confidence / 2, dof), dof


def capacity_interval(users: Sequence[int], intervals: Sequence[RateInterval], estimate: int, choose: Choose,
                      confidence: float = CONFIDENCE, num_resamples: int = NUM_RESAMPLES,
                      seed: int = SEED) -> CapacityInterval:
    """The capacity's interval over points at ``users`` with throughput ``intervals`` (the same order), whose
    capacity from the measured values was ``estimate`` users; ``choose`` makes the choice on one curve."""
    if len(users) != len(intervals) or not users:
        raise ValueError(f"need one interval per point, got {len(users)} points and {len(intervals)} intervals")
    chosen = [choose(list(users), list(row)) for row in redraw(intervals, num_resamples, seed)]
    picked = np.array([c for c in chosen if c is not None], dtype=float)
    if len(picked) == 0:
        return CapacityInterval(estimate, estimate, confidence, 0.0, num_resamples, False)
    tail = (1 - confidence) / 2
    low, high = np.quantile(picked, [tail, 1 - tail], method="inverted_cdf")
    low, high = int(low), int(high)
    share = float(np.mean(picked == estimate)) * len(picked) / num_resamples
    return CapacityInterval(min(low, estimate), max(high, estimate), confidence, share, num_resamples,
                            max(high, estimate) <= MAX_SPREAD * min(low, estimate))


def redraw(intervals: Sequence[RateInterval], num_resamples: int = NUM_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """``num_resamples`` curves (rows), each point drawn from a Student t around its value with its own
    standard error and degrees of freedom."""
    rng = np.random.default_rng(seed)
    values = np.array([i.value for i in intervals])
    errors = [standard_error(i) for i in intervals]
    se = np.array([e for e, _ in errors])
    # NOTE: every point's draw is independent: each measured its own window.
    return values + se * np.column_stack([rng.standard_t(dof, num_resamples) for _, dof in errors])


def weights_of(intervals: Sequence[RateInterval | None]) -> list[float] | None:
    """The points' precision weights (``reports.capacity.saturation.precision_weights``) from their intervals; None
    (equal weights) when any point has none."""
    return precision_weights([standard_error(i)[0] if i is not None else None for i in intervals])


def weighted_choice(intervals: Sequence[RateInterval]) -> Choose:
    """The capacity choice on a curve whose points are weighted by the precision of ``intervals`` (the measured
    ones: a redrawn curve keeps its points' weights)."""
    weights = weights_of(intervals)
    return lambda users, throughputs: choose_users(users, throughputs, weights)


# The share of the nominal tails the saturation interval leaves out. NOTE: the level is the top of a
# non-decreasing fit, which a lucky last point lifts; the central 95% of its redrawn levels held the true
# level in 91-95% of simulated searches (a flat plateau and a sharp knee the worst), the central 98% in
# 95.0-96.6% (four curve shapes, standard errors 2.5% and 10% of each point, 500 searches each; 2026-12-07,
# docs/concepts.md): so a 95% interval takes the central 98%.
SATURATION_TAIL_SHARE = 0.4


def saturation_interval(intervals: Sequence[RateInterval], confidence: float = CONFIDENCE,
                        num_resamples: int = NUM_RESAMPLES, seed: int = SEED) -> dict[str, float]:
    """The saturation throughput (``reports.capacity.saturation``, its points weighted by their precision) of the
    points with throughput ``intervals`` (in order of users) and its ``confidence`` interval: the central share
    of the same level over their redrawn curves that holds the true level at that rate (``SATURATION_TAIL_SHARE``,
    calibrated at 95%)."""
    if not intervals:
        raise ValueError("no points")
    weights = weights_of(intervals)
    levels = [saturation_throughput(row, weights) for row in redraw(intervals, num_resamples, seed)]
    tail = (1 - confidence) / 2 * SATURATION_TAIL_SHARE
    low, high = np.quantile(levels, [tail, 1 - tail])
    return {"value": saturation_throughput([i.value for i in intervals], weights), "low": float(low),
            "high": float(high), "confidence": confidence}
