"""A load point's engine speed: its decode forwards over the step calibration, and over the search's median point."""

from __future__ import annotations

import pytest

from probes.run_dir import CALIBRATION_NAME, LoadInfo, RunDirectory
from reports.capacity.knee import fit_knee
from reports.capacity.records import Capacity, CapacityPoint
from reports.dataset import RunDataset
from reports.levers.engine_speed import SLOWED_FACTOR, attach_engine_speed, engine_load_factor, slowdowns
from tests.reports.test_step_model import calibration, loaded_steps


def test_a_point_says_how_much_slower_its_engine_ran_than_its_calibration(tmp_path) -> None:
    """A point's engine load factor: its window's decode forwards over the calibration's (1.3 here), and
    nothing to say without the run's calibration."""
    calibrated = calibration()
    steps = loaded_steps(600, calibrated, "optimized", [1, 2, 4, 8])
    data = RunDataset(path=tmp_path, manifest=None, frames={"steps": steps}, client=None, load_info=None)
    window = (float(steps["start_time"].iloc[100]), float(steps["start_time"].iloc[500]))
    assert engine_load_factor(data, *window) is None  # no step_calibration.json in the run
    RunDirectory(tmp_path).save(CALIBRATION_NAME, calibrated)
    assert engine_load_factor(data, *window) == pytest.approx(1.3, rel=0.02)
    assert engine_load_factor(data, window[1] + 1e6, window[1] + 2e6) is None  # no step in that window


def test_a_point_whose_engine_ran_slower_than_the_searchs_median_point_is_named(tmp_path) -> None:
    """Each point's load factor against the median of the points from 2 users up: 1 user's is lower by design and
    is neither in the median nor judged; one point at 1.6x where the others ran 1.3x is named (1.23x the
    median), the others are not, and the report's headline says so."""
    from reports.html.capacity import headline

    calibrated = calibration()
    factors = {1: 1.1, 2: 1.3, 4: 1.3, 8: 1.3, 16: 1.6}
    points = []
    for users, factor in factors.items():
        path = tmp_path / f"users-{users}"
        path.mkdir()
        RunDirectory(path).save(CALIBRATION_NAME, calibrated)
        steps = loaded_steps(400, calibrated, "optimized", [min(users, 16)], seed=users, factor=factor)
        window = {"measure_from": float(steps["start_time"].iloc[50]), "stop_at": float(steps["start_time"].iloc[350])}
        points.append(RunDataset(path=path, manifest=None, frames={"steps": steps}, client=None,
                                 load_info=LoadInfo(config={"users": users}, window=window)))
    tput = {1: 20.0, 2: 40.0, 4: 70.0, 8: 95.0, 16: 80.0}
    capacity = Capacity(concurrency=8, output_tokens_per_s=95.0, goodput=None, method="knee", reason="synthetic",
                        limit=None, limit_evidence="", knee=fit_knee(list(map(float, tput)), list(tput.values())),
                        points=[CapacityPoint(u, t, None, None, None) for u, t in tput.items()], stopped="")
    attach_engine_speed(capacity, points)
    measured = {p.users: p.engine_load_factor for p in capacity.points}
    assert measured == pytest.approx(factors, rel=0.03)
    assert capacity.points[0].engine_slowdown is None  # one user: not judged against the others
    assert {p.users: p.engine_slowdown for p in capacity.points
            if (p.engine_slowdown or 0) >= SLOWED_FACTOR} == {
        16: pytest.approx(1.6 / 1.3, rel=0.03)}
    lines = headline(capacity.to_dict())
    slowed = [line for line in lines if line.startswith("The host ran the engine slower")]
    assert len(slowed) == 1 and "at 16 users" in slowed[0] and "at 8 users" not in slowed[0]


def test_too_few_points_give_no_median_to_judge_a_point_by() -> None:
    assert slowdowns({1: 1.1, 2: 1.3, 4: 2.0}) == {}
    assert slowdowns({2: 1.0, 4: None, 8: 1.2, 16: 1.5}) == pytest.approx({2: 1 / 1.2, 8: 1.0, 16: 1.25})
