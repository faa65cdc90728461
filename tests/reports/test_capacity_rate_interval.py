"""A point's throughput interval: tokens counted per sub-window, and the batch-means interval of their mean."""

from __future__ import annotations

import numpy as np
import pytest

from reports.capacity.interval import (
    batch_means_interval,
    num_batches_for,
    student_t_quantile,
    token_rate_series,
)


def test_tokens_fall_in_the_sub_window_they_arrived_in() -> None:
    # Chunks at 0.5 s (2 tokens), 1.2 s and 1.9 s (1 each), 3.5 s (4): rates per whole second from 0 to 3.
    rates = token_rate_series([0.5, 1.2, 1.9, 3.5], [2, 1, 1, 4], start=0.0, end=3.7)
    assert rates.tolist() == [2.0, 2.0, 0.0]  # the partial fourth second is dropped
    assert token_rate_series([0.5], [1], start=0.0, end=0.9).size == 0


def test_the_t_quantile_matches_the_table() -> None:
    # Student's t, two-sided 95% (the 0.975 quantile), from a printed table.
    for dof, exact in {3: 3.182, 4: 2.776, 5: 2.571, 7: 2.365, 10: 2.228, 30: 2.042}.items():
        assert student_t_quantile(0.975, dof) == pytest.approx(exact, rel=2e-3)


def test_too_few_sub_windows_give_no_interval() -> None:
    assert batch_means_interval([100.0, 101.0, 99.0]) is None
    interval = batch_means_interval([100.0] * 16)
    assert interval is not None and interval.low == interval.high == 100.0 and interval.num_batches == 4


def _ar1(rng: np.random.Generator, n: int, phi: float, sigma: float, mean: float) -> np.ndarray:
    """A stationary AR(1) series: each sub-window keeps ``phi`` of the last one's deviation."""
    x = np.empty(n)
    x[0] = rng.normal(0, sigma / np.sqrt(1 - phi * phi))
    for i in range(1, n):
        x[i] = phi * x[i - 1] + rng.normal(0, sigma)
    return mean + x


def test_the_interval_covers_the_true_rate_at_its_stated_confidence() -> None:
    # Independent sub-windows and moderately correlated ones (a request decodes through several):
    # over 400 seeded windows of 30 s the 95% interval covers the true mean about 95% of the time.
    rng = np.random.default_rng(7)
    for phi in (0.0, 0.5):
        intervals = [batch_means_interval(_ar1(rng, 30, phi, 10.0, 100.0)) for _ in range(400)]
        coverage = np.mean([i is not None and i.low <= 100.0 <= i.high for i in intervals])
        assert 0.91 <= coverage <= 0.99, (phi, coverage)


def test_batches_grow_with_the_window() -> None:
    assert [num_batches_for(n) for n in (4, 16, 30, 64, 200)] == [4, 4, 5, 8, 8]
