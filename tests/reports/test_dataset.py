"""Loading run directories: complete, external, crashed, and not a run at all."""

from __future__ import annotations

import json
import shutil

import pytest

from reports.dataset import DatasetError, RunDataset, load_points
from reports.html.report import write_report
from reports.verdict.diagnosis import diagnose


def test_a_probed_run_loads_with_client_latencies(scenario_dir) -> None:
    data = RunDataset.load(scenario_dir("max-num-seqs-2"))
    assert data.has_engine_probes and data.latency_source == "client"
    assert data.window_s > 0 and data.label == "users-16" and data.concurrency == 16
    measured = data.latencies
    assert measured["is_ok"].all() and (measured["ttft_s"] > 0).all()
    steps = data.steps_in_window()
    assert steps["start_time"].between(*data.window).all()
    assert len(data.prompts) > 0 and data.prompt_excerpt(0) is not None


def test_without_client_rows_the_engine_request_rows_are_used(scenario_dir, tmp_path) -> None:
    path = tmp_path / "run"
    shutil.copytree(scenario_dir("max-num-seqs-1"), path)
    (path / "client_requests.parquet").unlink()
    data = RunDataset.load(path)
    assert data.latency_source == "server" and len(data.latencies) > 0
    assert diagnose(path).bottleneck == "batching"
    assert write_report(path)["bottleneck"] == "batching"
    assert "as timed by the server" in (path / "report.html").read_text(encoding="utf-8")


def test_client_rows_alone_are_a_run(external_dir, tmp_path) -> None:
    path = tmp_path / "client-only"
    shutil.copytree(external_dir("client-cap"), path)
    (path / "run.json").unlink()
    data = RunDataset.load(path)
    assert data.manifest is None and not data.has_engine_probes and len(data.latencies) > 0
    assert diagnose(path).bottleneck == "batching"


def test_a_run_that_crashed_loads_from_its_part_files(scenario_dir, tmp_path) -> None:
    path = tmp_path / "crashed"
    shutil.copytree(scenario_dir("two-users-large-pool"), path)
    manifest = json.loads((path / "run.json").read_text())
    manifest["status"] = "running"
    manifest["probes"]["steps"]["state"] = "running"
    (path / "run.json").write_text(json.dumps(manifest))
    (path / "steps.parquet").rename(path / "steps.part-000000.parquet")
    assert RunDataset.load(path).has_engine_probes


def test_a_directory_that_is_no_run_is_refused_clearly(tmp_path) -> None:
    with pytest.raises(DatasetError, match="not a run directory"):
        RunDataset.load(tmp_path)
    with pytest.raises(DatasetError, match="no such directory"):
        load_points(tmp_path / "missing")
    (tmp_path / "load.json").write_text("{not json")
    (tmp_path / "client_requests.parquet").write_bytes(b"")
    with pytest.raises(DatasetError, match="client table"):
        RunDataset.load(tmp_path)
    (tmp_path / "client_requests.parquet").unlink()
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(DatasetError, match="lacks"):
        RunDataset.load(tmp_path)
