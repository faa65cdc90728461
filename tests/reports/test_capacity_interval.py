"""The capacity's interval: the choice made again on the points redrawn within their own intervals."""

from __future__ import annotations

import math

import numpy as np

from reports.capacity import choose_users
from reports.capacity_interval import capacity_interval
from reports.throughput_interval import RateInterval, student_t_quantile

USERS = [1, 2, 4, 6, 8, 12, 16, 32]  # a search's points: doubling to 32, midpoints 6 and 12


def _measured(rng: np.random.Generator, curve: dict[int, float], relative_se: float,
              num_batches: int = 6) -> tuple[list[float], list[RateInterval]]:
    """Each point's throughput drawn around the true curve with a known standard error, and the interval its
    batch means would give (``num_batches`` batches: t with one fewer degrees of freedom)."""
    dof = num_batches - 1
    q = student_t_quantile(0.975, dof)
    values = [curve[u] * (1 + relative_se * rng.standard_t(dof)) for u in USERS]
    return values, [RateInterval(v, v - q * relative_se * curve[u], v + q * relative_se * curve[u], 0.95,
                                 num_batches, 5.0) for u, v in zip(USERS, values, strict=True)]


def _coverage(curve: dict[int, float], relative_se: float, num_searches: int) -> tuple[float, int]:
    """How often the 95% capacity interval of a search holds the true curve's capacity, and that capacity."""
    truth = choose_users(USERS, [curve[u] for u in USERS])
    rng = np.random.default_rng(11)
    held = 0
    for search in range(num_searches):
        values, intervals = _measured(rng, curve, relative_se)
        interval = capacity_interval(USERS, intervals, choose_users(USERS, values), choose_users, num_resamples=100,
                                     seed=search)
        held += interval.low <= truth <= interval.high
    return held / num_searches, truth


def test_the_interval_covers_a_sharp_knee_at_its_stated_rate() -> None:
    # A seat limit: 12 tok/s per user up to 8 users, then almost flat. Points known within ±5% (95%).
    sharp = {u: 12.0 * u if u <= 8 else 96.0 + 0.5 * (u - 8) for u in USERS}
    coverage, truth = _coverage(sharp, 0.025, 40)
    assert truth == 8
    assert coverage >= 0.95


def test_the_interval_covers_a_soft_knee_at_its_stated_rate() -> None:
    # A device saturating by degrees: no seat, the knee the fit finds is not sharp, and single searches
    # disagree on it (8 or 12 users); their intervals still hold the true curve's choice.
    soft = {u: 120.0 * (1 - math.exp(-u / 6)) for u in USERS}
    coverage, truth = _coverage(soft, 0.025, 40)
    assert truth == 8
    assert coverage >= 0.9


def test_points_that_cannot_be_told_apart_name_no_capacity() -> None:
    soft = {u: 120.0 * (1 - math.exp(-u / 10)) for u in USERS}
    rng = np.random.default_rng(5)
    values, wide = _measured(rng, soft, 0.2)  # every point known only within ±50%
    interval = capacity_interval(USERS, wide, choose_users(USERS, values), choose_users)
    assert not interval.is_told_apart and interval.high > 4 * interval.low
    values, tight = _measured(rng, soft, 0.01)
    interval = capacity_interval(USERS, tight, choose_users(USERS, values), choose_users)
    assert interval.is_told_apart and interval.low <= interval.high <= 2 * interval.low
