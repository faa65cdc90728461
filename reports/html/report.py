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

from probes.run_dir import MANIFEST_NAME, REPORT_NAME, SUMMARY_NAME, RunDirectory, json_safe
from reports.html import sections
from reports.html.capacity import CapacitySection
from reports.html.levers import LeverSection
from reports.html.sections import ReportContext, Section
from reports.summary import RunSummary
from reports.verdict.diagnosis import Diagnosis, analyze, write_diagnosis

TEMPLATES = Path(__file__).with_name("templates")
# The page's sections, top to bottom: the capacity (after a search) and the verdict lead, then what each
# lever would buy, then the figures the verdict rests on.
SECTIONS: tuple[Section, ...] = (
    CapacitySection(),
    sections.VerdictSection(),
    LeverSection(),
    sections.TimelineSection(),
    sections.LatencySection(),
    sections.GoodputSection(),
    sections.StepBreakdownSection(),
    sections.ConcurrencySection(),
    sections.RooflineSection(),
    sections.AblationSection(),
    sections.RequestsSection(),
    sections.RunSection(),
)
_BY_ANCHOR: dict[str, Section] = {s.anchor: s for s in SECTIONS}
if len(_BY_ANCHOR) != len(SECTIONS):
    raise ValueError(f"two sections share an anchor: {sorted(s.anchor for s in SECTIONS)}")


def section(anchor: str) -> Section:
    """The page's section with ``anchor``; a ValueError naming every section when there is none."""
    try:
        return _BY_ANCHOR[anchor]
    except KeyError:
        raise ValueError(f"no report section {anchor!r}; the sections: {', '.join(_BY_ANCHOR)}") from None


def section_views(ctx: ReportContext) -> list[dict[str, Any]]:
    """Every section's anchor, title and blocks, in the page's order."""
    return [{"anchor": s.anchor, "title": s.title, "blocks": [b for b in s.blocks(ctx) if b is not None]}
            for s in SECTIONS]


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


@cache
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def build_context(path: str | os.PathLike[str]) -> ReportContext:
    """Load the directory at ``path`` once and judge it (for an ablation: its baseline variant)."""
    analysis = analyze(path)
    return ReportContext(root=analysis.root, points=analysis.points, focus=analysis.focus,
                         diagnosis=analysis.diagnosis, facts=analysis.facts, summary=analysis.summary,
                         point_verdicts=analysis.point_verdicts, sweep_parameter=analysis.summary.sweep_parameter,
                         ablation=analysis.ablation, capacity=analysis.capacity)


def render(ctx: ReportContext) -> str:
    return environment().get_template("report.html.jinja").render(
        diagnosis=ctx.diagnosis, sections=section_views(ctx), root=str(ctx.root), plotly_js=plotly_js(),
        focus_label=ctx.focus.label, num_points=len(ctx.points))


def write_report(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Write ``report.html``, ``diagnosis.json`` and ``summary.json`` into ``path`` (or ``out``).

    ``path`` is a run directory, a sweep directory (``sweep.json``) or an ablation directory
    (``ablation.json``); returns the diagnosis as a dict.
    """
    return json_safe(write_run_report(path, out)[0].to_dict())


def write_run_report(path: str | os.PathLike[str],
                     out: str | os.PathLike[str] | None = None) -> tuple[Diagnosis, RunSummary]:
    """:func:`write_report`, returning the verdict and the measures it wrote (what the console shows)."""
    ctx = build_context(path)
    if out is None:
        mark_warnings(ctx)
    run_dir = RunDirectory(Path(out) if out is not None else Path(path))
    run_dir.path.mkdir(parents=True, exist_ok=True)
    run_dir.save(SUMMARY_NAME, ctx.summary)
    html = render(ctx)
    tmp = run_dir.path / f".{REPORT_NAME}.tmp"
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, run_dir.file(REPORT_NAME))
    write_diagnosis(run_dir.path, ctx.diagnosis)
    return ctx.diagnosis, ctx.summary


def mark_warnings(ctx: ReportContext) -> None:
    """Write each point's client warnings into its ``run.json`` (the probes have stopped by now)."""
    for data, measures in zip(ctx.points, ctx.summary.points, strict=True):
        warnings = [w.to_dict() for w in measures.warnings]
        if data.manifest is not None and data.manifest.warnings != warnings:
            data.manifest.warnings = warnings
            RunDirectory(data.path).write_json(MANIFEST_NAME, data.manifest.to_dict())
