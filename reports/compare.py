"""Runs side by side: the same figures of each, and each run's deltas against the first.

Each figure knows which way is better (more throughput, less latency), so a delta is also
marked better or worse; :func:`regressions` lists those worse by more than a tolerance (the CI gate).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from reports.verdict.diagnosis import Diagnosis, diagnose, json_safe

Better = Literal["higher", "lower", "neither"]


@dataclass(frozen=True, slots=True)
class Figure:
    """A compared figure: where it lives in ``diagnosis.metrics`` and which way is better."""

    key: str
    label: str
    path: tuple[str, ...]
    better: Better
    scale: float = 1.0  # seconds -> ms for latencies


def _latency(name: str, stat: str) -> Figure:
    return Figure(f"{name}_{stat}", f"{name.upper()} {stat} (ms)", ("client", f"{name}_s", stat), "lower", 1000.0)


FIGURES: tuple[Figure, ...] = (
    Figure("output_throughput", "output tokens/s", ("client", "output_throughput"), "higher"),
    Figure("request_throughput", "requests/s", ("client", "request_throughput"), "higher"),
    *(_latency("ttft", s) for s in ("p50", "p90", "p99")),
    *(_latency("tpot", s) for s in ("p50", "p90", "p99")),
    *(_latency("itl", s) for s in ("p50", "p99")),
    *(_latency("e2e", s) for s in ("p50", "p99")),
    Figure("goodput_fraction", "goodput (share in SLO)", ("client", "goodput", "fraction"), "higher"),
    Figure("num_failed", "failed requests", ("client", "num_failed"), "lower"),
    Figure("mean_batch", "mean batch", ("server", "mean_batch"), "higher"),
    Figure("busy_fraction", "engine busy share", ("server", "busy_fraction"), "neither"),
    Figure("waiting_share", "share of busy time with requests waiting", ("server", "waiting_share"), "lower"),
    Figure("kv_usage_mean", "KV usage (mean)", ("server", "kv_usage_mean"), "neither"),
    Figure("num_preemptions", "preemptions", ("server", "num_preemptions"), "lower"),
    Figure("overhead_share", "host overhead share of a step", ("server", "overhead_share"), "lower"),
    Figure("decode_mbu", "decode MBU", ("roofline", "decode_mbu"), "higher"),
)


@dataclass(slots=True)
class Delta:
    """``value - baseline`` of one figure; ``relative`` is that over the baseline; ``is_better`` None when equal."""

    absolute: float | None
    relative: float | None
    is_better: bool | None


@dataclass(slots=True)
class RunColumn:
    label: str
    path: str
    bottleneck: str
    confidence: float
    values: dict[str, float | None]
    deltas: dict[str, Delta] = field(default_factory=dict)


@dataclass(slots=True)
class Comparison:
    runs: list[RunColumn]

    @property
    def baseline(self) -> RunColumn:
        return self.runs[0]

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            "baseline": self.baseline.label,
            "figures": [{"key": f.key, "label": f.label, "better": f.better} for f in FIGURES],
            "runs": [{"label": r.label, "path": r.path, "bottleneck": r.bottleneck, "confidence": r.confidence,
                      "values": r.values, "deltas": {k: {"absolute": d.absolute, "relative": d.relative,
                                                         "is_better": d.is_better} for k, d in r.deltas.items()}}
                     for r in self.runs]})


def figure_values(diagnosis: Diagnosis) -> dict[str, float | None]:
    """Every compared figure of one diagnosis (None where the run has no such figure)."""
    values: dict[str, float | None] = {}
    for fig in FIGURES:
        node: Any = diagnosis.metrics
        for key in fig.path:
            node = node.get(key) if isinstance(node, dict) else None
        values[fig.key] = float(node) * fig.scale if isinstance(node, int | float) else None
    return values


def delta(value: float | None, base: float | None, better: Better) -> Delta:
    if value is None or base is None:
        return Delta(None, None, None)
    diff = value - base
    relative = diff / abs(base) if base else (0.0 if diff == 0 else None)
    if diff == 0 or better == "neither":
        return Delta(diff, relative, None)
    return Delta(diff, relative, (diff > 0) == (better == "higher"))


def compare(paths: Sequence[str | os.PathLike[str]], labels: Sequence[str] | None = None) -> Comparison:
    """Diagnose every directory and take each run's deltas against the first."""
    if len(paths) < 1:
        raise ValueError("compare needs at least one run directory")
    labels = list(labels) if labels else _unique_labels([Path(p) for p in paths])
    runs = []
    for path, label in zip(paths, labels, strict=True):
        d = diagnose(path)
        runs.append(RunColumn(label, str(path), d.bottleneck, d.confidence, figure_values(d)))
    better = {f.key: f.better for f in FIGURES}
    for run in runs:
        run.deltas = {k: delta(v, runs[0].values[k], better[k]) for k, v in run.values.items()}
    return Comparison(runs)


def is_regression(d: Delta, tolerance: float) -> bool:
    """Worse than the baseline by more than ``tolerance``, relative to it."""
    return d.is_better is False and d.relative is not None and abs(d.relative) > tolerance


def regressions(comparison: Comparison, tolerance: float) -> list[str]:
    """Figures of any run worse than the baseline by more than ``tolerance`` (relative), in words."""
    out = []
    for run in comparison.runs[1:]:
        for fig in FIGURES:
            d = run.deltas[fig.key]
            if is_regression(d, tolerance):
                out.append(f"{run.label}: {fig.label} {run.values[fig.key]:.4g} vs {comparison.baseline.values[fig.key]:.4g} "
                           f"({d.relative:+.1%})")
    return out


def render_compare(comparison: Comparison) -> str:
    from reports.html.report import environment, plotly_js

    return environment().get_template("compare.html.jinja").render(
        comparison=comparison, figures=FIGURES, plotly_js=plotly_js(), chart=_throughput_chart(comparison))


def _throughput_chart(comparison: Comparison) -> str:
    import plotly.graph_objects as go
    import plotly.io as pio

    labels = [r.label for r in comparison.runs]
    fig = go.Figure([go.Bar(x=labels, y=[r.values["output_throughput"] for r in comparison.runs],
                            name="output tokens/s"),
                     go.Bar(x=labels, y=[r.values["ttft_p50"] for r in comparison.runs], name="TTFT p50 (ms)",
                            yaxis="y2")])
    fig.update_layout(barmode="group", template="plotly_white", height=360,
                      yaxis={"title": "output tokens/s"},
                      yaxis2={"title": "TTFT p50 (ms)", "overlaying": "y", "side": "right"})
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, config={"displaylogo": False},
                       div_id="compare-chart")


def _unique_labels(paths: list[Path]) -> list[str]:
    """The directory names, made unique by their parents where two share a name."""
    names = [p.name or str(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    return [str(p) for p in paths]
