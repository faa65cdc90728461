"""Reports: read a run directory, say which bottleneck holds the server back and which lever frees it, and
draw it.

``write_report(dir)`` writes ``dir/report.html`` and ``dir/diagnosis.json`` and returns the
diagnosis as a dict; ``reports.verdict.diagnosis.diagnose(dir)`` returns the verdict alone.
"""

from __future__ import annotations

from typing import Any


def write_report(path: Any, out: Any = None) -> dict[str, Any]:
    """See :func:`reports.html.report.write_report` (imported on first use: it pulls in plotly)."""
    from reports.html.report import write_report as _write_report

    return _write_report(path, out)


def write_run_report(path: Any, out: Any = None) -> tuple[Any, Any]:
    """See :func:`reports.html.report.write_run_report`: the verdict and the measures, as objects."""
    from reports.html.report import write_run_report as _write_run_report

    return _write_run_report(path, out)


__all__ = ["write_report", "write_run_report"]
