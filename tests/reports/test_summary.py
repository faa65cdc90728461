"""One set of measures: the console table, summary.json, diagnosis.json and report.html agree on a run."""

from __future__ import annotations

import re
import shutil

from rich.console import Console

from loadtests.progress import SUMMARY_COLUMNS, summary_table
from loadtests.summary import write_summary
from probes.run_dir import SUMMARY_NAME, RunDirectory
from reports.diagnosis import read_diagnosis
from reports.summary import RunSummary


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
