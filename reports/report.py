"""The HTML report of a run, sweep or ablation directory, and its ``diagnosis.json``.

The page is one self-contained file: plotly.js is inlined once in its head and every figure
draws from it, so the report opens offline. All text from the run (prompts, errors, labels)
reaches the page through Jinja2's autoescaping; figures carry no request text.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from reports.ablation import AblationTable, read_ablation_index
from reports.dataset import load_points, sweep_parameter
from reports.diagnosis import Diagnosis, diagnose, facts_for, json_safe, sweep_measures, write_diagnosis
from reports.sections import ReportContext, section_views

REPORT_NAME = "report.html"
DIAGNOSIS_NAME = "diagnosis.json"
TEMPLATES = Path(__file__).with_name("templates")


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


@cache
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def build_context(path: str | os.PathLike[str]) -> ReportContext:
    """Load the directory at ``path`` and diagnose it (for an ablation: its baseline variant)."""
    root = Path(path)
    index = read_ablation_index(root)
    run_path = root / next(v["dir"] for v in index["variants"] if v["name"] == index["baseline"]) if index else root
    diagnosis = diagnose(root)
    points = sorted(load_points(run_path), key=lambda p: p.concurrency or 0.0)
    focus = points[-1]
    parameter = sweep_parameter(run_path)
    sweep = None
    if len(points) > 1:
        sweep = sweep_measures(parameter or "load", [(p, m) for p, m in
                                                     zip(points, diagnosis.metrics["points"], strict=True)])
    ablation = AblationTable.from_dict(diagnosis.metrics["ablation"]) if index else None
    return ReportContext(root=root, points=points, focus=focus, diagnosis=diagnosis, facts=facts_for(focus, sweep),
                         sweep_parameter=parameter, ablation=ablation)


def render(ctx: ReportContext) -> str:
    return environment().get_template("report.html.jinja").render(
        diagnosis=ctx.diagnosis, sections=section_views(ctx), root=str(ctx.root), plotly_js=plotly_js(),
        focus_label=ctx.focus.label, num_points=len(ctx.points))


def write_report(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Write ``report.html`` and ``diagnosis.json`` into ``path`` (or ``out``); returns the diagnosis as a dict.

    ``path`` is a run directory, a sweep directory (``sweep.json``) or an ablation directory
    (``ablation.json``); this is what ``servescope diagnose`` calls once its runs are written.
    """
    ctx = build_context(path)
    target = Path(out) if out is not None else Path(path)
    target.mkdir(parents=True, exist_ok=True)
    html = render(ctx)
    tmp = target / f".{REPORT_NAME}.tmp"
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, target / REPORT_NAME)
    write_diagnosis(target, ctx.diagnosis)
    return json_safe(ctx.diagnosis.to_dict())


def read_diagnosis(path: str | os.PathLike[str]) -> Diagnosis:
    return Diagnosis.from_json((Path(path) / DIAGNOSIS_NAME).read_text(encoding="utf-8"))
