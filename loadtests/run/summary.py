"""The end of every load run: its measures, verdict and report, written once from one reading of the run.

``write_summary(out_dir)`` hands the directory to :func:`reports.write_run_report`, which loads
each point once and writes ``summary.json`` (the measures), ``diagnosis.json`` and
``report.html``; the console table of ``servescope load``/``diagnose`` is drawn from the same
measures (:func:`loadtests.run.progress.summary_table`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from reports import write_run_report
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
