"""One set of measures: the console table, summary.json, diagnosis.json and report.html agree on a run."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pandas as pd
from rich.console import Console

from loadtests.client.table import load_client_requests
from loadtests.run.finish import write_summary
from probes.loader import load_manifest
from probes.run_dir import CLIENT_HEALTH_TABLE, SUMMARY_NAME, RunDirectory
from probes.schemas import CLIENT_HEALTH
from reports.console import SUMMARY_COLUMNS, summary_table
from reports.dataset import RunDataset
from reports.measures import OpenLoopMeasures
from reports.summary import RunSummary, client_warnings
from reports.verdict.diagnosis import read_diagnosis


def _console_row(summary: RunSummary, label: str) -> dict[str, str]:
    console = Console(record=True, width=300)
    console.print(summary_table(summary))
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if cells and cells[0] == label:
            return dict(zip(SUMMARY_COLUMNS, cells, strict=True))
    raise AssertionError(f"no console row for {label}")


def _report_rows(html: str) -> list[list[str]]:
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S)]


def test_console_summary_and_report_show_the_same_batch_and_percentiles(scenario_dir, tmp_path) -> None:
    run = tmp_path / "run"
    shutil.copytree(scenario_dir("two-users-large-pool"), run)
    written = write_summary(run)
    point = written.measures.points[0]
    assert point.client is not None and point.server is not None
    console = _console_row(written.measures, point.label)
    rows = _report_rows((run / "report.html").read_text(encoding="utf-8"))

    # The mean batch: the step-time weighted measure, printed the same way in both.
    concurrency = next(r for r in rows if r and r[0] == point.label and len(r) == 7)
    assert console["batch"] == concurrency[5] == f"{point.server.mean_batch:.1f}"

    # Latency percentiles: the console rounds to whole ms above 10 ms, the report to 0.1 ms.
    latency = {r[1]: r for r in rows if len(r) >= 8 and r[0] == point.label and r[1] in ("TTFT", "TPOT", "E2E")}
    ttft_p50, ttft_p99 = (float(v) for v in console["TTFT p50/p99"].split("/"))
    for name, shown, stat in (("TTFT", ttft_p50, "p50"), ("TTFT", ttft_p99, "p99"),
                              ("TPOT", float(console["TPOT p50"]), "p50"), ("E2E", float(console["E2E p50"]), "p50")):
        measured_ms = getattr(point.client, f"{name.lower()}_s")[stat] * 1000
        column = 3 + ("p50", "p90", "p95", "p99").index(stat)
        assert abs(float(latency[name][column]) - measured_ms) <= 0.051
        assert abs(shown - measured_ms) <= 0.51

    # The files hold the same objects: summary.json's measures are the verdict's.
    saved = RunDirectory(run).load(SUMMARY_NAME, RunSummary)
    assert saved is not None and saved.points[0].server.mean_batch == point.server.mean_batch
    assert read_diagnosis(run).metrics["server"]["mean_batch"] == point.server.mean_batch
    assert console["ok/fail"] == f"{point.client.num_ok}/{point.client.num_failed}"


def _with_health(source, tmp_path, lag_s: float, cpu_share: float):
    """A copy of a real client run with its one worker's health samples, every 0.2 s over the run."""
    run = tmp_path / "run"
    shutil.copytree(source, run)
    rows = load_client_requests(run)
    worker = rows["worker"].iloc[0]
    times = np.arange(rows["send_time"].min(), rows["end_time"].max(), 0.2)
    frame = pd.DataFrame({"worker": worker, "time": times, "loop_lag_s": lag_s, "cpu_share": cpu_share})
    RunDirectory(run).write_frame(CLIENT_HEALTH_TABLE, frame, CLIENT_HEALTH)
    return run, rows, worker


def test_a_busy_lagging_client_is_warned_of_in_summary_run_json_and_report(external_dir, tmp_path) -> None:
    run, rows, worker = _with_health(external_dir("client-cap"), tmp_path, lag_s=0.03, cpu_share=0.97)
    written = write_summary(run)
    (point,) = written.measures.points
    (health,) = point.workers
    assert health.worker == worker and health.cpu_share_p50 == 0.97 and health.loop_lag_p95_s == 0.03
    # What the worker received in the measured window, from its own client rows.
    start, end = RunDataset.load(run).window
    measured = rows[~rows["is_warmup"] & (rows["worker"] == worker)]
    tokens = np.concatenate(list(measured["token_times"]))
    assert health.chunks_per_s == (((tokens >= start) & (tokens <= end)).sum()) / (end - start)
    assert {w.kind for w in point.warnings} == {"client_cpu", "client_ceiling"}
    assert [w["kind"] for w in load_manifest(RunDirectory(run)).warnings] == [w.kind for w in point.warnings]
    html = (run / "report.html").read_text(encoding="utf-8")
    assert html.count('class="warning"') == 2 and "30 ms late at p95" in html and "97% of a CPU core" in html
    saved = RunDirectory(run).load(SUMMARY_NAME, RunSummary)
    assert saved is not None and saved.points[0].warnings == point.warnings


def test_a_client_with_headroom_gets_no_warning_and_clears_an_old_mark(external_dir, tmp_path) -> None:
    run, _, _ = _with_health(external_dir("client-cap"), tmp_path, lag_s=0.03, cpu_share=0.97)
    write_summary(run)
    assert load_manifest(RunDirectory(run)).warnings
    _with_health(external_dir("client-cap"), tmp_path / "again", lag_s=0.001, cpu_share=0.3)
    shutil.copy(tmp_path / "again" / "run" / f"{CLIENT_HEALTH_TABLE}.parquet", run)
    (point,) = write_summary(run).measures.points
    assert point.workers and point.workers[0].cpu_share_p50 == 0.3 and point.warnings == []
    assert load_manifest(RunDirectory(run)).warnings == []
    assert 'class="warning"' not in (run / "report.html").read_text(encoding="utf-8")


def test_open_loop_sends_behind_schedule_are_warned_of() -> None:
    def lagging(p95_s: float) -> OpenLoopMeasures:
        return OpenLoopMeasures(offered_rate_per_s=50.0, achieved_send_rate_per_s=40.0,
                                send_lag_s={"p50": p95_s / 2, "p95": p95_s, "max": p95_s})

    assert client_warnings([], lagging(0.049), 1) == []
    (warning,) = client_warnings([], lagging(0.08), 1)
    assert warning.kind == "open_loop_lag" and warning.value == 0.08 and "80 ms late at p95" in warning.message
