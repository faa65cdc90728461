"""A point's throughput interval: tokens counted per sub-window, and the batch-means interval of their mean."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reports.capacity.interval import (
    RateInterval,
    batch_means_interval,
    num_batches_for,
    student_t_quantile,
    token_rate_series,
)
from reports.capacity.point import prefill_rate_series
from reports.dataset import RunDataset


def test_tokens_fall_in_the_sub_window_they_arrived_in() -> None:
    # Chunks at 0.5 s (2 tokens), 1.2 s and 1.9 s (1 each), 3.5 s (4): rates per whole second from 0 to 3.
    rates = token_rate_series([0.5, 1.2, 1.9, 3.5], [2, 1, 1, 4], start=0.0, end=3.7)
    assert rates.tolist() == [2.0, 2.0, 0.0]  # the partial fourth second is dropped
    assert token_rate_series([0.5], [1], start=0.0, end=0.9).size == 0


def test_the_t_quantile_matches_the_table() -> None:
    # Student's t, two-sided 95% (the 0.975 quantile), from a printed table.
    for dof, exact in {3: 3.182, 4: 2.776, 5: 2.571, 7: 2.365, 10: 2.228, 30: 2.042}.items():
        assert student_t_quantile(0.975, dof) == pytest.approx(exact, rel=2e-3)


def test_a_rate_interval_never_reaches_below_zero() -> None:
    # four batches of 0, 40, 0 and 40 tok/s about a mean of 20: the t interval would start near -17; a rate cannot
    interval = batch_means_interval(([0.0] * 4 + [40.0] * 4) * 2)
    assert interval is not None and interval.value == pytest.approx(20.0)
    assert interval.low == 0.0 and interval.high > 40.0
    assert interval.half_width == pytest.approx(interval.high - 20.0)  # the uncut half


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


def _prefill_bursts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Prompt tokens prefilled per sub-window: long prompts land now and then, one to three seconds each."""
    z = np.zeros(n)
    at = 0
    while at < n:
        at += int(rng.integers(1, 5))
        length = int(rng.integers(1, 4))
        z[at:at + length] += rng.uniform(100.0, 400.0)
    return z


def test_the_controlled_interval_covers_the_rate_given_its_prefill_at_its_stated_confidence() -> None:
    # The output rate falls by 0.3 tokens per prefilled token (as on this CPU) around 100 tok/s, plus AR(1)
    # noise. A rerun of one seed prefills the same tokens, so the rate to cover is the one given this window's
    # prefill, 100 - 0.3 * mean(z). The plain interval counts where the long prompts fell as noise and is wider.
    rng = np.random.default_rng(11)
    covered, ratios = [], []
    for _ in range(400):
        z = _prefill_bursts(rng, 24)
        x = _ar1(rng, 24, 0.3, 4.0, 100.0) - 0.3 * z
        controlled, plain = batch_means_interval(x, control=z), batch_means_interval(x)
        assert controlled is not None and plain is not None and controlled.controlled and controlled.dof == 2
        truth = 100.0 - 0.3 * z.mean()
        covered.append(controlled.low <= truth <= controlled.high)
        ratios.append(controlled.half_width / plain.half_width)
    assert 0.91 <= np.mean(covered) <= 0.99, np.mean(covered)
    assert np.median(ratios) < 0.6


def test_a_control_that_does_not_vary_leaves_the_plain_interval() -> None:
    x = _ar1(np.random.default_rng(3), 20, 0.2, 5.0, 50.0)
    plain, flat = batch_means_interval(x), batch_means_interval(x, control=np.full(20, 7.0))
    assert flat is not None and not flat.controlled and flat == plain
    with pytest.raises(ValueError, match="one control value per rate"):
        batch_means_interval(x, control=np.zeros(19))


def test_an_interval_keeps_whether_it_was_controlled_and_an_older_record_reads_as_plain() -> None:
    x = _ar1(np.random.default_rng(4), 20, 0.2, 5.0, 50.0)
    controlled = batch_means_interval(x, control=np.arange(20.0))
    assert controlled is not None and RateInterval.from_dict(controlled.to_dict()) == controlled
    older = {k: v for k, v in controlled.to_dict().items() if k != "controlled"}
    assert not RateInterval.from_dict(older).controlled and RateInterval.from_dict(older).dof == controlled.num_batches - 1


def _dataset(client: pd.DataFrame) -> RunDataset:
    """A point's run as the capacity reads it, from client rows alone (no engine probes)."""
    return RunDataset(path=Path("."), manifest=None, frames={}, client=client, load_info=None)


def test_prefill_is_spread_over_each_requests_wait_for_its_first_token() -> None:
    # 150 prompt tokens, 50 of them cached, sent at 0.5 s, first token at 2.5 s: 100 tokens over 2 s. A failed
    # request counts nothing; one whose first token came the instant it was sent counts where it came.
    client = pd.DataFrame({"is_ok": [True, False, True], "send_time": [0.5, 0.0, 2.2],
                           "first_token_time": [2.5, 1.0, 2.2], "num_prompt_tokens": [150, 999, 30],
                           "num_cached_tokens": [50, 0, None]})
    rates = prefill_rate_series(_dataset(client), 0.0, 3.5)
    assert rates is not None and rates.tolist() == pytest.approx([25.0, 50.0, 25.0 + 30.0])
