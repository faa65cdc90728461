"""The capacity read from every point at once: the curve made non-decreasing, its saturation level, and the
fewest users within PLATEAU_SHARE of it."""

from __future__ import annotations

import numpy as np
import pytest

from reports.capacity.saturation import (
    PLATEAU_SHARE,
    choose_users,
    monotone_fit,
    plateau_start,
    saturation_throughput,
)


def test_the_fit_pools_points_that_fall_and_keeps_those_that_rise() -> None:
    assert monotone_fit([1.0, 2.0, 3.0]).tolist() == [1.0, 2.0, 3.0]
    assert monotone_fit([1.0, 3.0, 2.0]).tolist() == [1.0, 2.5, 2.5]
    # A fall that reaches back over two points pools all three.
    assert monotone_fit([10.0, 30.0, 25.0, 5.0]).tolist() == pytest.approx([10.0, 20.0, 20.0, 20.0])
    assert monotone_fit([]).size == 0


def test_the_fit_is_the_least_squares_non_decreasing_curve() -> None:
    rng = np.random.default_rng(0)
    y = np.sort(rng.uniform(0, 100, 12)) + rng.normal(0, 15, 12)
    fit = monotone_fit(y)
    assert np.all(np.diff(fit) >= 0) and fit.mean() == pytest.approx(y.mean())
    best = float(np.sum((fit - y) ** 2))
    for _ in range(200):  # no other non-decreasing curve near it fits better
        other = np.maximum.accumulate(fit + rng.normal(0, 2, 12))
        assert float(np.sum((other - y) ** 2)) >= best - 1e-9


def test_a_plateau_is_read_as_the_mean_of_its_points_not_its_best_one() -> None:
    users = [1, 2, 4, 8, 12, 16, 24, 32]
    tputs = [24.0, 44.0, 73.0, 90.0, 101.0, 118.0, 104.0, 98.0]  # 16 users read high, 24 and 32 low
    assert saturation_throughput(tputs) == pytest.approx((118.0 + 104.0 + 98.0) / 3)
    assert plateau_start(users, tputs) == 16
    # 90 at 8 users is below 90% of 106.7; 101 at 12 is not.
    assert choose_users(users, tputs) == 12


def test_a_seat_limit_and_a_serial_server_and_a_curve_still_rising() -> None:
    users = [1, 2, 4, 8, 16, 32]
    assert choose_users(users, [12.0 * min(u, 8) for u in users]) == 8
    assert choose_users(users, [20.0, 19.0, 21.0, 20.5, 19.5, 20.0]) == 1
    # Still rising at the heaviest point: the capacity is where the measured curve comes within 90% of its top.
    rising = [10.0 * u for u in users]
    assert choose_users(users, rising) == 32 and saturation_throughput(rising) == 320.0
    # A tail still rising more than the share past a bend puts the capacity past the bend (the definition).
    creeping = [12.0 * u if u <= 8 else 96.0 + 0.6 * (u - 8) for u in users]
    assert creeping[3] < PLATEAU_SHARE * creeping[-1] and choose_users(users, creeping) == 16


def test_a_curve_that_falls_at_the_heaviest_point_pools_it_into_the_plateau() -> None:
    users = [1, 2, 4, 8, 16, 32]
    tputs = [20.0, 40.0, 80.0, 100.0, 104.0, 70.0]  # thrashing at 32
    assert saturation_throughput(tputs) == pytest.approx((100.0 + 104.0 + 70.0) / 3)
    assert choose_users(users, tputs) == 8  # 80 at 4 users is below 0.9 * 91.3; the pooled 91.3 at 8 is not


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="ascend"):
        choose_users([1, 4, 2], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="one throughput per point"):
        choose_users([1, 2], [1.0])
    with pytest.raises(ValueError, match="no throughputs"):
        saturation_throughput([])


def test_points_are_weighted_by_their_precision() -> None:
    from reports.capacity.saturation import precision_weights

    assert monotone_fit([10.0, 30.0, 20.0], [1.0, 1.0, 3.0]).tolist() == [10.0, 22.5, 22.5]
    # A heaviest point known to ±60 tok/s that reads low barely moves the plateau two precise points set.
    users, tputs = [1, 2, 4, 8, 16], [30.0, 60.0, 100.0, 104.0, 70.0]
    weights = precision_weights([1.0, 1.0, 2.0, 2.0, 30.0])
    assert saturation_throughput(tputs) == pytest.approx((100.0 + 104.0 + 70.0) / 3)
    assert saturation_throughput(tputs, weights) == pytest.approx((104.0 / 4 + 70.0 / 900) / (1 / 4 + 1 / 900))
    assert choose_users(users, tputs, weights) == 4
    assert precision_weights([1.0, None]) is None and precision_weights([]) is None
    assert precision_weights([2.0, 0.0]) == [0.25, 1 / 0.02 ** 2]  # a zero-width interval: a hundredth of the least
    with pytest.raises(ValueError, match="positive weight"):
        monotone_fit([1.0, 2.0], [1.0, 0.0])
