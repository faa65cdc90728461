"""What a finished run prints in the terminal: every point's measures, their warnings, the capacity and the
verdict with its deciding evidence; the same objects ``summary.json`` and ``report.html`` hold."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from probes.run_dir import DIAGNOSIS_NAME, REPORT_NAME
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
    console.print(f"wrote {out / DIAGNOSIS_NAME} and {out / REPORT_NAME}")


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
