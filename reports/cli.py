"""``servescope report DIR`` and ``servescope compare DIR1 DIR2 ...``, as register functions for
``servescope``'s one ``main`` (loadtests.cli)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from probes.run_dir import RUNS_DIR


def _cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from probes.run_dir import DIAGNOSIS_NAME, REPORT_NAME
    from reports.html.report import write_report
    from reports.verdict.evidence import NO_VERDICT

    result = write_report(args.dir, args.out)
    target = Path(args.out) if args.out else Path(args.dir)
    console = Console(stderr=True)
    if result["bottleneck"] == NO_VERDICT:
        console.print(f"[bold red]{result['summary']}[/]")
        console.print(f"wrote {target / REPORT_NAME} and {target / DIAGNOSIS_NAME}")
        return 1
    console.print(f"bottleneck: [bold]{result['bottleneck']}[/] ({result['confidence_label']} confidence, "
                  f"{result['confidence']:.2f}): {result['summary']}")
    console.print(f"lever to try: {result['lever']}")
    console.print(f"wrote {target / REPORT_NAME} and {target / DIAGNOSIS_NAME}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from probes.run_dir import RunDirectory
    from reports.compare import FIGURES, compare, regressions, render_compare
    from reports.whole_table import print_whole

    comparison = compare(args.dirs, args.labels.split(",") if args.labels else None)
    table = Table(title=f"servescope compare (deltas against {comparison.baseline.label})")
    table.add_column("figure")
    for i, run in enumerate(comparison.runs):
        table.add_column(run.label, justify="right")
        if i:
            table.add_column("delta", justify="right")
    table.add_row("bottleneck", *[c for i, r in enumerate(comparison.runs) for c in ([r.bottleneck] if not i else
                                                                                      [r.bottleneck, ""])])
    for fig in FIGURES:
        cells = []
        for i, run in enumerate(comparison.runs):
            value = run.values[fig.key]
            cells.append("-" if value is None else f"{value:.4g}")
            if i:
                d = run.deltas[fig.key]
                style = "" if d.is_better is None else "green" if d.is_better else "red"
                text = "-" if d.absolute is None else f"{d.absolute:+.4g}"
                cells.append(f"[{style}]{text}[/]" if style else text)
        table.add_row(fig.label, *cells)
    console = Console()
    print_whole(console, table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_compare(comparison), encoding="utf-8")
    if args.json:
        RunDirectory(Path(args.json).parent).write_json(Path(args.json).name, comparison.to_dict())
    console.print(f"wrote {out}" + (f" and {args.json}" if args.json else ""))
    if args.max_regression is not None:
        worse = regressions(comparison, args.max_regression)
        for line in worse:
            console.print(f"[red]regression:[/] {line}")
        return 1 if worse else 0
    return 0


def register_report(subparsers: Any) -> None:
    """Add ``servescope report``."""
    p = subparsers.add_parser(
        "report", help="(re)write DIR/report.html and DIR/diagnosis.json from a run directory",
        description="Diagnose a run, sweep or ablation directory (ours with engine probes, or an external "
                    "server's with client rows and /metrics) and write its HTML report and diagnosis.json.")
    p.add_argument("dir", type=Path, help="the run directory")
    p.add_argument("--out", type=Path, default=None, help="write the two files here instead of into DIR")
    p.set_defaults(func=_cmd_report)


def register_compare(subparsers: Any) -> None:
    """Add ``servescope compare``."""
    p = subparsers.add_parser(
        "compare", help="runs side by side with deltas against the first",
        description="Diagnose each run directory and show their figures side by side, with each run's deltas "
                    "against the first; optionally fail when any figure regresses past a tolerance.")
    p.add_argument("dirs", nargs="+", type=Path, help="run directories; the first is the baseline")
    p.add_argument("--labels", default=None, help="comma-separated names for the runs (default: directory names)")
    p.add_argument("--out", default=str(RUNS_DIR / "compare.html"), help="HTML file to write (default %(default)s)")
    p.add_argument("--json", default=None, help="also write the comparison as JSON here")
    p.add_argument("--max-regression", type=float, default=None,
                   help="exit 1 if any figure is worse than the baseline's by more than this share (0.1 = 10%%)")
    p.set_defaults(func=_cmd_compare)

