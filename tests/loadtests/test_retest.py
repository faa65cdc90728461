"""``diagnose --retest``: pull the lever predicted to gain most, rerun the same load, stop when none would gain 10%.

The rounds run the real engine in-process (tests.reports.driver, as the scenario suite does) instead
of a server under Locust, so each round takes seconds; the retest logic around them is the command's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console

from engine.flags import add_engine_args, engine_config_from_args
from loadtests.config import LoadConfig
from loadtests.retest import apply_flags, run_retest
from probes.run_dir import CALIBRATION_NAME
from probes.step_calibration import StepCalibration
from reports import write_report
from tests.reports.driver import Load, run
from tests.reports.scenarios import SHORT


def in_process_round(load: LoadConfig, round_dir: Path, argv: list[str], calibrate: bool = False) -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(argv))
    engine = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("device", "num_threads")}
    run(round_dir, Load(users=load.users, duration_s=load.duration_s, warmup_s=load.warmup_s, workload_args=SHORT),
        engine, time_paths=calibrate)
    write_report(round_dir)


def _load(users: int) -> LoadConfig:
    return LoadConfig(users=users, duration_s=2.0, warmup_s=0.5, workload="fixed")


def test_the_named_lever_is_pulled_measured_and_the_rounds_stop_at_n(tmp_path: Path) -> None:
    out = tmp_path / "retest"
    pulls = run_retest(_load(6), out, ["--model", "dummy:tiny", "--host-overhead-ms", "20"], "dummy:tiny",
                       Console(quiet=True), max_rounds=1, run_round=in_process_round)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["round-0", "round-1"]
    (pull,) = pulls
    assert pull["lever"] == "host_overhead" and pull["flags"] == "--host-overhead-ms 0"
    assert pull["measured_gain"] > 1.5  # 20 ms of burnt host time per step, several times the step itself
    before = json.loads((out / "round-0" / "diagnosis.json").read_text())
    pulled = next(lv for lv in before["levers"] if lv["lever"] == "host_overhead")
    assert pulled["measured_gain"] == pull["measured_gain"]
    after = json.loads((out / "round-1" / "diagnosis.json").read_text())
    assert after["predictions"]["retest"]["flags"] == "--host-overhead-ms 0"
    assert "This round pulled --host-overhead-ms 0" in (out / "round-1" / "report.html").read_text()


def test_the_rounds_stop_when_no_lever_is_predicted_to_gain_ten_percent(tmp_path: Path) -> None:
    # 4 users on 4 seats: more seats, budget or memory cannot help, and more users would only queue
    out = tmp_path / "saturated"
    pulls = run_retest(_load(4), out, ["--model", "dummy:tiny", "--max-num-seqs", "4"], "dummy:tiny",
                       Console(quiet=True), max_rounds=3, run_round=in_process_round)
    assert pulls == []
    assert [p.name for p in out.iterdir() if p.is_dir()] == ["round-0"]
    diagnosis = json.loads((out / "round-0" / "diagnosis.json").read_text())
    assert diagnosis["predictions"]["best"] is None
    assert all(not lv["worth_pulling"] for lv in diagnosis["levers"])


def test_flags_replace_their_old_values_and_drop_what_the_lever_removes() -> None:
    argv = ["--model", "dummy:tiny", "--max-num-seqs", "2", "--no-prefix-caching", "--kv-cache-mb", "8"]
    assert apply_flags(argv, ["--max-num-seqs", "4"], []) == [
        "--model", "dummy:tiny", "--no-prefix-caching", "--kv-cache-mb", "8", "--max-num-seqs", "4"]
    assert apply_flags(argv, ["--num-kv-blocks", "64"], ["--kv-cache-mb", "--num-kv-blocks"]) == [
        "--model", "dummy:tiny", "--max-num-seqs", "2", "--no-prefix-caching", "--num-kv-blocks", "64"]
    assert apply_flags(argv, [], ["--no-prefix-caching"]) == [
        "--model", "dummy:tiny", "--max-num-seqs", "2", "--kv-cache-mb", "8"]


def test_the_execution_verdict_and_prediction_read_the_one_step_calibration(tmp_path: Path) -> None:
    """An eager run: the step calibration (before the load) is what both the execution evidence and the
    ``--execution optimized`` prediction read; without it neither claims a figure."""
    out = tmp_path / "eager"
    in_process_round(_load(4), out, ["--model", "dummy:tiny", "--execution", "eager"], calibrate=True)
    calibration = StepCalibration.from_dict(json.loads((out / CALIBRATION_NAME).read_text()))
    assert calibration.run_path == "eager" and calibration.other_path == "optimized"
    diagnosis = json.loads((out / "diagnosis.json").read_text())
    paths = diagnosis["metrics"]["execution_paths"]
    for path in ("eager", "optimized"):
        assert paths["step_s"][path] == pytest.approx(calibration.step(path, paths["batch"]))
    lever = next(lv for lv in diagnosis["levers"] if lv["lever"] == "execution")
    assert lever["predicted_gain"] is not None and "calibrated before the load" in lever["note"]
    assert diagnosis["predictions"]["step_model"]["calibrated"]
    # the calibrated model's replay of the run's own settings gives back what was measured, within the issue's
    # 10% aim. NOTE: on a 2-core AMD EPYC (2026-12-07) 10 such runs read -5.0% to -0.1%, 8 beside two busy
    # loops -2.5% to +0.9%, and a slowed clean-clone run's record -2.9% (-28% before the fit's per-step term
    # could take back a calibrated step's host part that read too long)
    assert abs(diagnosis["predictions"]["replay_check"]["throughput_error"]) < 0.10

    (out / CALIBRATION_NAME).unlink()
    diagnosis = write_report(out)
    lever = next(lv for lv in diagnosis["levers"] if lv["lever"] == "execution")
    assert lever["predicted_gain"] is None and "not predicted" in lever["note"]
    assert diagnosis["metrics"]["execution_paths"] is None


def test_after_a_capacity_search_the_verdicts_point_is_the_one_rerun(tmp_path: Path) -> None:
    from loadtests.retest import focus_load
    from probes.run_dir import LOAD_NAME, LoadInfo, RunDirectory

    point = LoadConfig(users=12, duration_s=12.0, warmup_s=3.0, workload="sharegpt-synth")
    (tmp_path / "users-12").mkdir()
    RunDirectory(tmp_path / "users-12").save(LOAD_NAME, LoadInfo(config=point.to_dict()))
    base = LoadConfig(users=1, duration_s=12.0, warmup_s=3.0, workload="sharegpt-synth", max_tokens=64)
    rerun = focus_load(tmp_path, {"label": "users-12"}, base)
    assert (rerun.users, rerun.duration_s, rerun.warmup_s, rerun.max_tokens) == (12, 12.0, 3.0, 64)
    with pytest.raises(ValueError, match="no load.json"):
        focus_load(tmp_path, {"label": "users-99"}, base)
