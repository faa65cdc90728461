"""The A/B gate's statistics on synthetic per-round ratios whose true shift is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reports.gate.stats import estimate_slowdown, min_samples, signed_rank_null


def draws(shift: float, noise: float, n: int, seed: int) -> list[float]:
    """``n`` paired ratios: a true slowdown ``shift`` times log-normal round noise of spread ``noise``."""
    rng = np.random.default_rng(seed)
    return list((1 + shift) * np.exp(rng.normal(0.0, noise, n)))


def test_null_distribution_matches_the_published_table() -> None:
    # Wilcoxon signed-rank tables: n = 10, two-sided 5%: the lower critical value is 8, P(T+ <= 8) = 25/1024.
    probs = signed_rank_null(10)
    assert probs.sum() == pytest.approx(1.0)
    assert probs[:9].sum() == pytest.approx(25 / 1024)
    assert probs[:10].sum() == pytest.approx(33 / 1024)  # 9 is no longer significant
    assert probs == pytest.approx(probs[::-1])  # symmetric around n(n+1)/4


def test_interval_is_the_tabled_walsh_order_statistics() -> None:
    # n = 10 at 95%: the bounds are the 9th smallest and the 9th largest of the 55 Walsh averages.
    logs = np.log([1.02, 0.97, 1.10, 1.04, 0.99, 1.06, 1.01, 1.08, 0.95, 1.03])
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(10) for j in range(i, 10))
    s = estimate_slowdown(np.exp(logs), threshold=0.05)
    assert s.low == pytest.approx(math.expm1(walsh[8]))
    assert s.high == pytest.approx(math.expm1(walsh[-9]))
    assert s.estimate == pytest.approx(math.expm1(np.median(walsh)))
    assert s.low < s.estimate < s.high


def test_no_shift_passes_and_the_interval_covers_zero() -> None:
    results = [estimate_slowdown(draws(0.0, 0.05, 20, seed), threshold=0.05) for seed in range(200)]
    assert sum(r.is_regression for r in results) == 0
    coverage = sum(r.low <= 0 <= r.high for r in results) / len(results)
    assert coverage >= 0.9  # nominal 95%; 200 draws
    assert all(r.p_value > 0.025 for r in results)


def test_a_ten_percent_shift_fails_a_five_percent_threshold() -> None:
    results = [estimate_slowdown(draws(0.10, 0.03, 20, seed), threshold=0.05) for seed in range(200)]
    assert sum(r.is_regression for r in results) >= 190
    assert sum(r.low <= 0.10 <= r.high for r in results) / len(results) >= 0.9
    assert np.median([r.estimate for r in results]) == pytest.approx(0.10, abs=0.01)


def test_a_shift_within_the_threshold_is_measured_but_passes() -> None:
    s = estimate_slowdown(draws(0.02, 0.01, 20, seed=3), threshold=0.05)
    assert s.is_measured_slower and not s.is_regression
    assert s.p_change < 0.01 and s.p_value > 0.5


def test_p_value_and_interval_always_agree() -> None:
    for seed in range(300):
        s = estimate_slowdown(draws(0.06, 0.04, 12, seed), threshold=0.05)
        assert s.is_regression == (s.p_value <= 0.025), s


def test_one_wild_round_does_not_fail_an_unchanged_build() -> None:
    ratios = draws(0.0, 0.02, 20, seed=1)
    ratios[7] = 3.0  # the machine stalled during one candidate run
    s = estimate_slowdown(ratios, threshold=0.05)
    assert not s.is_regression
    assert abs(s.estimate) < 0.02


def test_bad_samples_are_refused() -> None:
    assert min_samples(0.95) == 6
    with pytest.raises(ValueError, match="at least 6"):
        estimate_slowdown([1.0] * 5, threshold=0.05)
    with pytest.raises(ValueError, match="positive"):
        estimate_slowdown([1.0] * 9 + [0.0], threshold=0.05)
    with pytest.raises(ValueError, match="confidence"):
        estimate_slowdown([1.0] * 10, threshold=0.05, confidence=1.5)
