"""The knee fit recovers known breakpoints of synthetic throughput curves; the Wilson interval matches published values."""

from __future__ import annotations

import numpy as np
import pytest

from reports.capacity.knee import fit_knee, wilson_interval

USERS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]


def saturating(users: list[int], knee: int, per_user: float, after: float = 0.0) -> list[float]:
    """Throughput that grows ``per_user`` per user up to ``knee``, then ``after`` per user."""
    return [per_user * min(u, knee) + after * max(u - knee, 0) for u in users]


@pytest.mark.parametrize("knee", [2, 4, 6, 12, 16])
def test_the_fit_recovers_the_breakpoint_of_a_seat_limited_curve(knee: int) -> None:
    fit = fit_knee(USERS, saturating(USERS, knee, per_user=50.0))
    assert fit.has_knee, fit.reason
    assert fit.breakpoint == knee
    assert fit.slope_before == pytest.approx(50.0) and fit.slope_after == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_the_breakpoint_survives_noise_and_a_slight_slope_after_the_knee(seed: int) -> None:
    rng = np.random.default_rng(seed)
    users = [1, 2, 4, 8, 6, 3, 16]  # the order a search measures them in
    clean = saturating(users, 4, per_user=100.0, after=3.0)
    noisy = [y * (1 + rng.normal(0, 0.03)) for y in clean]
    fit = fit_knee(users, noisy)
    assert fit.has_knee, fit.reason
    assert fit.breakpoint == 4


def test_a_straight_line_has_no_knee() -> None:
    fit = fit_knee(USERS, [30.0 * u + 5 for u in USERS])
    assert not fit.has_knee
    assert "still rises" in fit.reason or "no clear bend" in fit.reason


def test_a_flat_curve_has_no_knee() -> None:
    fit = fit_knee([1, 2, 4, 8], [100.0, 99.0, 101.0, 100.0])
    assert not fit.has_knee


def test_two_points_cannot_show_a_knee() -> None:
    fit = fit_knee([1, 2], [10.0, 20.0])
    assert not fit.has_knee and fit.breakpoint is None and "at least 3" in fit.reason


def test_the_fit_predicts_its_own_segments() -> None:
    fit = fit_knee(USERS, saturating(USERS, 8, per_user=10.0, after=1.0))
    assert fit.predict(8) == pytest.approx(80.0)
    assert fit.predict(4) == pytest.approx(40.0)
    assert fit.predict(16) == pytest.approx(88.0)


# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Statistics in Medicine 17,
# table I, method 3 (Wilson score interval without continuity correction), to 4 decimals.
@pytest.mark.parametrize(("successes", "trials", "low", "high"), [
    (81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)])
def test_wilson_interval_matches_published_values(successes: int, trials: int, low: float, high: float) -> None:
    interval = wilson_interval(successes, trials)
    assert interval.value == pytest.approx(successes / trials)
    assert interval.low == pytest.approx(low, abs=5e-5) and interval.high == pytest.approx(high, abs=5e-5)


def test_wilson_interval_is_not_zero_width_at_the_ends_and_stays_in_range() -> None:
    all_good = wilson_interval(10, 10)
    assert all_good.high == pytest.approx(1.0) and 0.6 < all_good.low < 1.0
    assert wilson_interval(0, 5).low == 0.0 and wilson_interval(0, 5).high > 0.0


def test_wilson_interval_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 3)
    with pytest.raises(ValueError, match="trials"):
        wilson_interval(0, 0)


def test_a_server_is_serial_only_when_no_number_of_users_adds_throughput() -> None:
    from reports.capacity.limit import SERIAL_GAIN, serial_gain

    # transformers serve --continuous-batching on the 2-core box: flat from 1 to 2 users, then it batches.
    assert serial_gain({1: 12.8, 2: 12.8, 4: 20.4, 8: 37.8, 16: 33.0}) > SERIAL_GAIN
    # transformers serve without it: one request at a time, however many users.
    assert serial_gain({1: 12.8, 2: 15.2, 4: 13.1, 3: 13.7}) < SERIAL_GAIN
    assert serial_gain({1: 12.8}) is None and serial_gain({2: 5.0, 4: 6.0}) is None
