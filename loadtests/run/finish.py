"""The end of every load run: its measures, verdict and report, written once from one reading of the run, and
printed.

:func:`finish_run` hands the directory to :func:`reports.write_run_report`, which loads each point
once and writes ``summary.json`` (the measures), ``diagnosis.json`` and ``report.html``; the terminal
shows the same objects (:func:`reports.console.print_run`). ``servescope load``/``diagnose`` and a
plain Locust run (loadtests.run.plain_run) all end here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from loadtests.errors import NoVerdictError, ReportFailedError
from reports import write_run_report
from reports.console import print_run
from reports.summary import RunSummary
from reports.verdict.diagnosis import Diagnosis


@dataclass(slots=True)
class Summary:
    """What :func:`write_summary` wrote: the measures (``summary.json``) and the verdict (``diagnosis.json``)."""

    measures: RunSummary
    diagnosis: Diagnosis


def write_summary(out_dir: str | os.PathLike[str]) -> Summary:
    """Write ``summary.json``, ``diagnosis.json`` and ``report.html`` into ``out_dir``."""
    diagnosis, measures = write_run_report(out_dir)
    return Summary(measures, diagnosis)


def finish_run(out: Path, console: Console) -> Summary:
    """The end of a load run, however it was started: write its summary, verdict and report, and print them.

    Raises ReportFailedError (the run is safe on disk) when the report cannot be written, and
    NoVerdictError when the run cannot be judged.
    """
    try:
        summary = write_summary(out)
    except Exception as exc:  # noqa: BLE001 - the run itself is safe on disk; say how to retry
        raise ReportFailedError(f"the run in {out} is complete, but writing its report failed: "
                                f"{type(exc).__name__}: {exc}; rerun `servescope report {out}`") from exc
    print_run(console, summary.measures, summary.diagnosis, out)
    if not summary.diagnosis.has_verdict:
        raise NoVerdictError(f"the run in {out} cannot be judged: {summary.diagnosis.summary}")
    return summary
