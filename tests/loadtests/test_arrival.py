"""Open-loop arrival schedules: seeded, independent per worker, at the asked rate and burstiness."""

from __future__ import annotations

import itertools
import statistics

import pytest

from loadtests.workloads.arrival import OpenLoopArrivals, worker_rng

NUM_GAPS = 20_000


def first_gaps(arrivals: OpenLoopArrivals, seed: int, worker: int, n: int = NUM_GAPS) -> list[float]:
    return list(itertools.islice(arrivals.gaps(worker_rng(seed, worker)), n))


def test_same_seed_same_schedule_and_workers_differ() -> None:
    arrivals = OpenLoopArrivals(rate=5.0)
    assert first_gaps(arrivals, 1, 0, 50) == first_gaps(arrivals, 1, 0, 50)
    assert first_gaps(arrivals, 1, 0, 50) != first_gaps(arrivals, 1, 1, 50)
    assert first_gaps(arrivals, 1, 0, 50) != first_gaps(arrivals, 2, 0, 50)


@pytest.mark.parametrize(("burstiness", "burst_size"), [(1.0, 1), (0.25, 1), (4.0, 1), (1.0, 8)])
def test_mean_rate_and_spread(burstiness: float, burst_size: int) -> None:
    rate = 10.0
    gaps = first_gaps(OpenLoopArrivals(rate, burstiness, burst_size), seed=0, worker=0)
    mean = statistics.fmean(gaps)
    # 20k gaps: the standard error of the mean is at most 1.4% (CV 2, at shape 0.25); seeded, so fixed.
    assert mean == pytest.approx(burst_size / rate, rel=0.05)
    # Gamma gaps of shape k have a coefficient of variation of 1 / sqrt(k): 1 for Poisson.
    assert statistics.stdev(gaps) / mean == pytest.approx(burstiness ** -0.5, rel=0.05)


def test_workers_split_the_rate() -> None:
    share = OpenLoopArrivals(12.0, 0.5, 2).for_worker(3)
    assert (share.rate, share.burstiness, share.burst_size) == (4.0, 0.5, 2)


def test_bad_arrivals() -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        OpenLoopArrivals(0.0)
    with pytest.raises(ValueError, match="burst_size"):
        OpenLoopArrivals(1.0, burst_size=0)
