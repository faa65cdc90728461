"""What a finished run prints in the terminal: every point's measures, their warnings, the capacity and the
verdict with its deciding evidence; the same objects ``summary.json`` and ``report.html`` hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from probes.run_dir import DIAGNOSIS_NAME, REPORT_NAME
from reports.failures import FailureCounts
from reports.summary import RunSummary
from reports.verdict.diagnosis import Diagnosis
from reports.whole_table import print_whole


def print_run(console: Console, measures: RunSummary, diagnosis: Diagnosis, out: Path) -> None:
    """The table of every point, its warnings, the capacity (after a search) and the verdict of the run in ``out``."""
    print_whole(console, summary_table(measures))  # NOTE: never cut to 80 columns off a terminal
    for point in measures.points:
        if not point.accounting.is_consistent:
            console.print(f"[yellow]warning:[/] {point.label}: the request counts disagree: "
                          f"{point.accounting.to_dict()}")
        for warning in point.warnings:
            console.print(f"[yellow]warning:[/] {point.label}: {warning.message}", highlight=False)
        if point.client is not None and point.client.num_retried:
            console.print(f"{point.label}: {point.client.num_retried} requests were sent again on a fresh connection: "
                          f"the server closed their pooled keep-alive connection before any answer (counted apart "
                          f"in the client rows' num_retries, not as failures)", highlight=False)
    for label, failures in (diagnosis.metrics.get("failures") or {}).items():
        console.print(f"failures: {label}: {FailureCounts.from_dict(failures).describe()}; read as "
                      f"{failures['read_as']}", highlight=False)
    if diagnosis.capacity is not None and diagnosis.has_verdict:
        from reports.html.capacity import headline  # NOTE: imported here: it pulls in plotly

        for line in headline(diagnosis.capacity):
            console.print(f"[bold]{line}[/]" if line.startswith("Capacity") else line, highlight=False)
    if not diagnosis.has_verdict:
        console.print(f"[bold red]{diagnosis.summary}[/]")
        console.print(f"wrote {out / DIAGNOSIS_NAME} and {out / REPORT_NAME}")
        return
    at = f" (at {diagnosis.label})" if diagnosis.capacity is not None else ""
    console.print(f"bottleneck{at}: [bold]{diagnosis.bottleneck}[/]: {diagnosis.summary}", highlight=False)
    evidence = [e for e in diagnosis.evidence if e.name in diagnosis.deciding]
    for e in evidence:
        console.print(f"  evidence: {e.summary} ({e.name})", highlight=False)
    print_best_lever(console, diagnosis.predictions)
    console.print(f"wrote {out / DIAGNOSIS_NAME} and {out / REPORT_NAME}")


def print_best_lever(console: Console, predictions: dict[str, Any] | None) -> None:
    """The run's last word: the lever predicted to gain most, its gain and its accuracy cost (or why none)."""
    if not predictions:
        return
    best = predictions.get("best_lever")
    if best is not None:
        console.print(f"[bold]lever to pull:[/] {best['text']}", highlight=False)
        console.print("  rerun with --retest to pull it under the same load and measure it against the prediction",
                      highlight=False)
    else:
        console.print(f"[bold]levers:[/] {predictions.get('verdict')}", highlight=False)


def summary_table(summary: RunSummary) -> Table:
    """The headline numbers of every point, for the terminal: the same measures the report shows."""
    table = Table(title="servescope: measured, warm-up excluded (latencies in ms)")
    for column in SUMMARY_COLUMNS:
        table.add_column(column, justify="right")
    for p in summary.points:
        c, s = p.client, p.server
        goodput = c.goodput["fraction"] if c is not None and c.goodput else None
        if c is None:
            table.add_row(p.label, "-", *["-"] * (len(SUMMARY_COLUMNS) - 3), _fmt(s.mean_batch if s else None, "{:.1f}"))
            continue
        table.add_row(
            p.label, f"{c.num_ok}/{c.num_failed}", _fmt(c.request_throughput, "{:.2f}"),
            _fmt(c.output_throughput, "{:.1f}"), f"{_ms(c.ttft_s, 'p50')}/{_ms(c.ttft_s, 'p99')}",
            _ms(c.tpot_s, "p50"), _ms(c.e2e_s, "p50"), _fmt(goodput, "{:.0%}"),
            _fmt(s.mean_batch if s is not None else None, "{:.1f}"),
        )
    return table


SUMMARY_COLUMNS = ("point", "ok/fail", "req/s", "out tok/s", "TTFT p50/p99", "TPOT p50", "E2E p50", "goodput",
                   "batch")


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _ms(dist: dict[str, float] | None, key: str) -> str:
    if dist is None:
        return "-"
    ms = dist[key] * 1000
    return f"{ms:.1f}" if ms < 10 else f"{ms:.0f}"
