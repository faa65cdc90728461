"""The report's sections, in order: small registered classes that turn a run into blocks the template draws.

A section always appears (with a note saying why when the run lacks its data), so a reader
finds the same headings in every report.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import plotly.graph_objects as go
import plotly.io as pio

from reports import figures
from reports.ablation import AblationTable
from reports.dataset import RunDataset
from reports.diagnosis import Diagnosis
from reports.evidence import Facts
from reports.measures import PERCENTILES, distribution
from reports.roofline import read_peaks, resolve_model_shape, step_work

_PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}
SLOWEST_REQUESTS = 10


@dataclass(slots=True)
class Block:
    """One thing a section shows: ``kind`` is figure (``html``), table (``columns``/``rows``) or note (``text``)."""

    kind: str
    html: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    text: str = ""
    caption: str = ""
    highlight: list[bool] = field(default_factory=list)  # table rows to emphasize


@dataclass(slots=True)
class ReportContext:
    """What every section may read: the run's load points, the one the verdict is about, the verdict."""

    root: Path
    points: list[RunDataset]
    focus: RunDataset
    diagnosis: Diagnosis
    facts: Facts
    sweep_parameter: str | None = None
    ablation: AblationTable | None = None
    _figure_count: int = 0

    def figure(self, fig: go.Figure | None, caption: str = "") -> Block | None:
        if fig is None:
            return None
        self._figure_count += 1
        html = pio.to_html(fig, full_html=False, include_plotlyjs=False, config=_PLOTLY_CONFIG,
                           div_id=f"figure-{self._figure_count}")
        return Block("figure", html=html, caption=caption)


class Section(ABC):
    anchor: ClassVar[str]
    title: ClassVar[str]

    @abstractmethod
    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        """The section's content; None entries are dropped."""


SECTIONS: list[Section] = []


def register(cls: type[Section]) -> type[Section]:
    SECTIONS.append(cls())
    return cls


def note(text: str) -> Block:
    return Block("note", text=text)


def table(columns: list[str], rows: list[list[Any]], caption: str = "", highlight: list[bool] | None = None) -> Block:
    return Block("table", columns=columns, rows=[[fmt(v) for v in row] for row in rows], caption=caption,
                 highlight=highlight or [])


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


@register
class VerdictSection(Section):
    anchor, title = "verdict", "Verdict"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        d = ctx.diagnosis
        rows, marks = [], []
        for e in d.evidence:
            result = "not measurable" if e.passed is None else "passed" if e.passed else "not passed"
            rows.append([e.name, e.bottleneck, e.summary, e.value, f"{e.comparison} {e.threshold:g}", result, e.why])
            marks.append(e.name in d.deciding)
        out: list[Block | None] = [
            table(["rule", "speaks for", "figure", "value", "threshold", "result", "why this threshold"], rows,
                  caption="Evidence: the rules that decided the verdict are highlighted", highlight=marks)]
        if d.also:
            out.insert(0, note(f"Also firing, lower in the decision order: {', '.join(d.also)}."))
        points = d.metrics.get("points")
        if points:
            out.append(table(["point", "verdict", "confidence"],
                             [[p["label"], p["bottleneck"], p["confidence"]] for p in points],
                             caption="Verdict at each point of the sweep"))
        return out


@register
class TimelineSection(Section):
    anchor, title = "timelines", "Timelines"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        fig = ctx.figure(figures.timeline_figure(ctx.focus), f"Batch size, queue, KV usage, utilization "
                                                             f"({ctx.focus.label})")
        out = [fig or note("No time series in this run (no engine steps, /metrics scrapes or host samples).")]
        if ctx.facts.server is not None:
            out.append(ctx.figure(figures.wait_limits_figure(ctx.facts.server),
                                  "Why waiting requests were not in the batch"))
        return out


@register
class LatencySection(Section):
    anchor, title = "latency", "Latency percentiles and CDFs"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        rows = []
        for point in ctx.points:
            ok = point.latencies[point.latencies["is_ok"].astype(bool)] if len(point.latencies) else point.latencies
            for column, name in figures.LATENCIES:
                values = ok[column] if column != "itl_s" else [g for gaps in ok[column] if gaps is not None
                                                                for g in gaps]
                dist = distribution(values) if len(ok) else None
                rows.append([point.label, name, *(ms(dist[k]) if dist else "–" for k in
                                                  ("mean", *(f"p{p}" for p in PERCENTILES), "max")),
                             dist["count"] if dist else 0])
        if not rows:
            return [note("No request timings in this run.")]
        source = ctx.focus.latency_source
        return [table(["point", "metric", "mean ms", *(f"p{p} ms" for p in PERCENTILES), "max ms", "count"], rows,
                      caption=f"Measured requests (warm-up left out), as timed by the {source}"),
                ctx.figure(figures.latency_cdf_figure(ctx.points))]


@register
class GoodputSection(Section):
    anchor, title = "goodput", "Goodput"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        slo = dict(ctx.focus.load_config.get("slo") or {})
        c = ctx.facts.client
        out: list[Block | None] = []
        if c is not None and c.goodput is not None:
            g = c.goodput
            out.append(table(["SLO", "good requests", "share", "good requests/s"],
                             [[", ".join(f"{k} <= {v:g} s" for k, v in g["slo_s"].items()), g["num_good"],
                               g["fraction"], g["good_requests_per_s"]]]))
        else:
            out.append(note("No SLO was set for this run (--slo ttft=S,tpot=S); the curve shows goodput for any "
                            "TTFT bound."))
        out.append(ctx.figure(figures.goodput_figure(ctx.focus, slo)))
        return out


@register
class StepBreakdownSection(Section):
    anchor, title = "steps", "Step-time breakdown"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        s = ctx.facts.server
        if s is None:
            return [note("No engine steps: the server was external, so its step times are not visible.")]
        steps = ctx.focus.steps_in_window()
        total = float(steps["total_s"].sum()) or 1.0
        rows = [[p.removesuffix("_s"), float(steps[p].sum()) / total, ms(float(steps[p].mean()))]
                for p in figures.PHASES]
        return [table(["phase", "share of step time", "mean ms per step"], rows,
                      caption=f"{s.num_steps} steps, mean {s.mean_step_s * 1000:.2f} ms; idle gaps between steps "
                              f"with work pending: {s.gap_share:.1%}"),
                ctx.figure(figures.step_breakdown_figure(steps))]


@register
class ConcurrencySection(Section):
    anchor, title = "concurrency", "Throughput vs concurrency"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        points = ctx.diagnosis.metrics.get("points")
        if not points:
            c = ctx.facts.client
            return [note("A single load point; run a sweep (--sweep users=1,4,16) to see throughput against "
                         "concurrency."),
                    table(["point", "output tokens/s", "requests/s"],
                          [[ctx.focus.label, c.output_throughput if c else None,
                            c.request_throughput if c else None]])]
        rows = [[p["label"], (p["client"] or {}).get("output_throughput"), (p["client"] or {}).get("request_throughput"),
                 ms(((p["client"] or {}).get("ttft_s") or {}).get("p50")),
                 ms(((p["client"] or {}).get("tpot_s") or {}).get("p50")), p["bottleneck"]] for p in points]
        return [table(["point", "output tokens/s", "requests/s", "TTFT p50 ms", "TPOT p50 ms", "verdict"], rows),
                ctx.figure(figures.concurrency_figure(sorted(ctx.points, key=lambda p: p.concurrency or 0.0),
                                                      points, ctx.sweep_parameter or "load"))]


@register
class RooflineSection(Section):
    anchor, title = "roofline", "Roofline"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        r = ctx.facts.roofline
        if r is None:
            return [note("No roofline: it needs the engine's steps and the model's shape (external servers and "
                         "unknown models have neither).")]
        peaks = read_peaks(ctx.focus.path)
        rows = [["decode", r.num_decode_steps, r.decode_mbu, r.decode_mfu, r.decode_forward_mbu],
                ["prefill", r.num_prefill_steps, r.prefill_mbu, r.prefill_mfu, None]]
        caption = (f"{r.model.name}: {r.model.weight_bytes / 2**20:.1f} MiB of weights in {r.model.dtype}, "
                   f"{r.model.kv_bytes_per_token} KV bytes per token. ")
        caption += (f"Peaks on {peaks.device}: {peaks.bandwidth_bytes_per_s / 1e9:.1f} GB/s, "
                    f"{peaks.flops_per_s / 1e9:.1f} GFLOP/s ({peaks.method})" if peaks else
                    "No machine_peaks.json in the run: MBU and MFU need the peaks measured at run start.")
        shape = resolve_model_shape(ctx.focus.model, ctx.focus.engine_config.get("dtype", "float32"))
        work = step_work(ctx.focus.steps_in_window(), shape) if shape else None
        return [table(["steps", "count", "MBU (median)", "MFU (median)", "MBU of the forward alone"], rows,
                      caption=caption),
                ctx.figure(figures.roofline_figure(work, peaks) if work is not None else None)]


@register
class AblationSection(Section):
    anchor, title = "ablation", "Ablation"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        a = ctx.ablation
        if a is None:
            return [note("Not an ablation run; `servescope diagnose --ablate` runs the same load with each lever "
                         "switched off in turn.")]
        rows = [[r.name, r.lever or "–", r.output_throughput, r.request_throughput, ms(r.ttft_p50), ms(r.ttft_p90),
                 ms(r.ttft_p99), ms(r.tpot_p50), ms(r.tpot_p90), ms(r.tpot_p99), r.throughput_vs_baseline,
                 r.ttft_vs_baseline, r.tpot_vs_baseline, r.throughput_vs_naive, r.bottleneck] for r in a.rows]
        return [table(["variant", "lever off", "output tok/s", "req/s", "TTFT p50", "TTFT p90", "TTFT p99",
                       "TPOT p50", "TPOT p90", "TPOT p99", f"tok/s vs {a.baseline}", f"TTFT vs {a.baseline}",
                       f"TPOT vs {a.baseline}", "tok/s vs naive", "verdict"], rows,
                      caption="Latencies in ms; ratios are variant / reference",
                      highlight=[r.name == a.baseline for r in a.rows])]


@register
class RequestsSection(Section):
    anchor, title = "requests", "Slowest and failed requests"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        rows = ctx.focus.latencies
        if rows.empty:
            return [note("No requests in this run.")]
        worst = rows.sort_values("e2e_s", ascending=False, na_position="first").head(SLOWEST_REQUESTS)
        body = [[r.request_id, r.status_code, r.finish_reason, ms(r.ttft_s), ms(r.e2e_s), r.num_prompt_tokens,
                 r.num_output_tokens, r.error, ctx.focus.prompt_excerpt(r.plan_index)]
                for r in worst.itertuples(index=False)]
        return [table(["request", "status", "finish", "TTFT ms", "E2E ms", "prompt tokens", "output tokens", "error",
                       "prompt"], body, caption="Failed requests first, then by end-to-end latency")]


@register
class RunSection(Section):
    anchor, title = "run", "Run"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        m = ctx.focus.manifest
        rows = [["directory", str(ctx.root)], ["model", ctx.focus.model],
                ["load", json.dumps(ctx.focus.load_config, sort_keys=True, default=str)],
                ["prefix-cache hit rate", prefix_cache_line(ctx)]]
        if m is not None:
            rows += [["engine config", json.dumps(m.engine_config, sort_keys=True, default=str)],
                     ["machine", json.dumps(m.machine.to_dict(), sort_keys=True, default=str)],
                     ["git", f"{m.git_commit} (dirty: {m.git_dirty})"], ["status", m.status.value],
                     ["probes", ", ".join(f"{n}: {p.state.value}{'' if p.is_available else ' (unavailable)'}"
                                          for n, p in m.probes.items())]]
            if m.error:
                rows.append(["error", m.error])
        out = [table(["", ""], rows)]
        stats = ctx.focus.locust_stats
        if stats is not None and len(stats):
            columns = [c for c in ("Type", "Name", "Request Count", "Failure Count", "Median Response Time",
                                   "99%", "Requests/s") if c in stats.columns]
            out.append(table(columns, stats[columns].values.tolist(), caption="Locust's own statistics "
                                                                              "(locust_stats.csv)"))
        return out


def prefix_cache_line(ctx: ReportContext) -> str:
    """Prompt tokens served from the prefix cache: per the engine's steps, and per the responses' usage."""
    server = (ctx.diagnosis.metrics.get("server") or {}).get("prefix_hit_rate")
    parts = [f"{server:.1%} of prefill tokens (engine steps)"] if server is not None else []
    rows = ctx.focus.client
    if rows is not None and len(rows) and "num_cached_tokens" in rows:
        measured = rows[~rows["is_warmup"] & rows["num_cached_tokens"].notna()]
        prompt = float(measured["num_prompt_tokens"].sum())
        if prompt:
            parts.append(f"{float(measured['num_cached_tokens'].sum()) / prompt:.1%} of prompt tokens "
                         f"(usage.prompt_tokens_details.cached_tokens)")
    return "; ".join(parts) or "not reported by this server"


def section_views(ctx: ReportContext) -> list[dict[str, Any]]:
    """Every registered section's anchor, title and blocks, in order."""
    return [{"anchor": s.anchor, "title": s.title, "blocks": [b for b in s.blocks(ctx) if b is not None]}
            for s in SECTIONS]

