"""The report's sections: small classes that turn a run into blocks the template draws (their order:
:data:`reports.html.report.SECTIONS`).

A section always appears (with a note saying why when the run lacks its data), so a reader
finds the same headings in every report.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import plotly.graph_objects as go
import plotly.io as pio

from probes.schemas import STEP_PHASES
from reports.ablation import AblationTable
from reports.capacity.records import Capacity
from reports.dataset import RunDataset
from reports.html import figures
from reports.measures import PERCENTILES
from reports.roofline import step_work
from reports.summary import RunSummary
from reports.verdict.diagnosis import Diagnosis
from reports.verdict.evidence import Facts

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
    summary: RunSummary
    point_verdicts: list[Diagnosis]
    sweep_parameter: str | None = None
    ablation: AblationTable | None = None
    capacity: Capacity | None = None
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


def note(text: str) -> Block:
    return Block("note", text=text)


def warning(text: str) -> Block:
    return Block("warning", text=text)


def table(columns: list[str], rows: list[list[Any]], caption: str = "", highlight: list[bool] | None = None) -> Block:
    return Block("table", columns=columns, rows=[[fmt(v) for v in row] for row in rows], caption=caption,
                 highlight=highlight or [])


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def share(value: float | None) -> str:
    """A fraction as a percentage, with enough digits that a small share does not read as 0."""
    if value is None:
        return "–"
    return f"{value:.1%}" if value == 0 or value >= 0.001 else f"{value * 100:.2g}%"


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


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
        many = len(ctx.summary.points) > 1
        out[:0] = [warning(f"Client warning{f' at {p.label}' if many else ''}: {w.message}.")
                   for p in ctx.summary.points for w in p.warnings]
        if len(ctx.points) > 1:
            out.append(table(["point", "verdict", "confidence"],
                             [[v.label, v.bottleneck, v.confidence] for v in ctx.point_verdicts],
                             caption="Verdict at each point of the sweep"))
        return out


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


class LatencySection(Section):
    anchor, title = "latency", "Latency percentiles and CDFs"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        rows = []
        for point in ctx.summary.points:
            if point.client is None:
                continue
            for column, name in figures.LATENCIES:
                dist = getattr(point.client, column)
                rows.append([point.label, name, *(ms(dist[k]) if dist else "–" for k in
                                                  ("mean", *(f"p{p}" for p in PERCENTILES), "max")),
                             dist["count"] if dist else 0])
        if not rows:
            return [note("No request timings in this run.")]
        source = ctx.focus.latency_source
        return [table(["point", "metric", "mean ms", *(f"p{p} ms" for p in PERCENTILES), "max ms", "count"], rows,
                      caption=f"Measured requests (warm-up left out), as timed by the {source}"),
                ctx.figure(figures.latency_cdf_figure(ctx.points))]


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


class StepBreakdownSection(Section):
    anchor, title = "steps", "Step-time breakdown"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        s = ctx.facts.server
        if s is None:
            return [note("No engine steps: the server was external, so its step times are not visible.")]
        steps = ctx.focus.steps_in_window()
        total = float(steps["total_s"].sum()) or 1.0
        rows = [[p.removesuffix("_s"), share(float(steps[p].sum()) / total), ms(float(steps[p].mean()))]
                for p in STEP_PHASES.values()]
        return [table(["phase", "share of step time", "mean ms per step"], rows,
                      caption=f"{s.num_steps} steps, mean {s.mean_step_s * 1000:.2f} ms; idle gaps between steps "
                              f"with work pending: {s.gap_share:.1%}"),
                ctx.figure(figures.step_breakdown_figure(steps))]


class ConcurrencySection(Section):
    anchor, title = "concurrency", "Throughput vs concurrency"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        rows = []
        for m, verdict in zip(ctx.summary.points, ctx.point_verdicts, strict=True):
            c, s = m.client, m.server
            rows.append([m.label, c.output_throughput if c else None, c.request_throughput if c else None,
                         ms(c.ttft_s["p50"] if c and c.ttft_s else None),
                         ms(c.tpot_s["p50"] if c and c.tpot_s else None),
                         f"{s.mean_batch:.1f}" if s is not None else None, verdict.bottleneck])
        columns = ["point", "output tokens/s", "requests/s", "TTFT p50 ms", "TPOT p50 ms",
                   "mean batch (step-time weighted)", "verdict"]
        if len(ctx.points) < 2:
            return [note("A single load point; run a sweep (--sweep users=1,4,16) to see throughput against "
                         "concurrency."), table(columns, rows)]
        return [table(columns, rows),
                ctx.figure(figures.concurrency_figure(ctx.summary.points, ctx.sweep_parameter or "load"))]


class RooflineSection(Section):
    anchor, title = "roofline", "Roofline"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        r = ctx.facts.roofline
        if r is None:
            return [note("No roofline: it needs the engine's steps and the model's shape (external servers and "
                         "unknown models have neither).")]
        peaks = ctx.focus.peaks
        ratios = {"decode MBU": r.decode_mbu, "decode MFU": r.decode_mfu, "prefill MBU": r.prefill_mbu,
                  "prefill MFU": r.prefill_mfu, "decode forward MBU": r.decode_forward_mbu}
        above = {name: v for name, v in ratios.items() if v is not None and v > 1.0}

        def roofed(value: float | None) -> float | str | None:
            # NOTE: a share of the roof above 1 is impossible; it means the peaks were measured low.
            return f"above the roof ({value:.2f})" if value is not None and value > 1.0 else value

        rows = [["decode", r.num_decode_steps, roofed(r.decode_mbu), roofed(r.decode_mfu),
                 roofed(r.decode_forward_mbu)],
                ["prefill", r.num_prefill_steps, roofed(r.prefill_mbu), roofed(r.prefill_mfu), None]]
        caption = (f"{r.model.name}: {r.model.weight_bytes / 2**20:.1f} MiB of weights in {r.model.dtype}, "
                   f"{r.model.kv_bytes_per_token} KV bytes per token. ")
        caption += (f"Peaks on {peaks.device}: {peaks.bandwidth_bytes_per_s / 1e9:.1f} GB/s, "
                    f"{peaks.flops_per_s / 1e9:.1f} GFLOP/s ({peaks.method})" if peaks else
                    "No machine_peaks.json in the run: MBU and MFU need the peaks measured at run start.")
        work = step_work(ctx.focus.steps_in_window(), r.model)
        out: list[Block | None] = []
        if above:
            out.append(note("Not plotted: " + ", ".join(f"{k} {v:.2f}" for k, v in above.items())
                            + " exceed 1, which no step can reach; the peaks in machine_peaks.json were measured "
                              "too low (on a busy machine, or while the load ran). Rerun so the peaks are "
                              "measured on an idle device."))
        out.append(table(["steps", "count", "MBU (median)", "MFU (median)", "MBU of the forward alone"], rows,
                         caption=caption))
        if not above:
            out.append(ctx.figure(figures.roofline_figure(work, peaks)))
        return out


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
        out = [table(["", ""], rows), workers_table(ctx), load_workers_table(ctx)]
        stats = ctx.focus.locust_stats
        if stats is not None and len(stats):
            columns = [c for c in ("Type", "Name", "Request Count", "Failure Count", "Median Response Time",
                                   "99%", "Requests/s") if c in stats.columns]
            out.append(table(columns, stats[columns].values.tolist(), caption="Locust's own statistics "
                                                                              "(locust_stats.csv)"))
        return out


def workers_table(ctx: ReportContext) -> Block:
    """How hard each load worker process worked in the measured window (loadtests.client.health)."""
    index = next((i for i, p in enumerate(ctx.points) if p is ctx.focus), len(ctx.points) - 1)
    workers = ctx.summary.points[index].workers
    if not workers:
        return note("No load-worker health samples in the measured window (a run from before they were recorded, "
                    "or one too short).")
    rows = [[w.worker, w.num_samples, share(w.cpu_share_p50), share(w.cpu_share_max), ms(w.loop_lag_p50_s),
             ms(w.loop_lag_p95_s), ms(w.loop_lag_max_s), w.chunks_per_s, w.requests_per_s] for w in workers]
    return table(["worker", "samples", "CPU p50 (of a core)", "CPU max", "loop lag p50 ms", "loop lag p95 ms",
                  "loop lag max ms", "chunks/s", "requests/s"], rows,
                 caption="The load generator's own health: a busy or late worker reads the server's timing late")


def load_workers_table(ctx: ReportContext) -> Block | None:
    """Each Locust worker of a run with a master, as the master saw it: rows brought home, lost or not."""
    info = ctx.focus.load_info
    if info is None or not info.workers:
        return None
    rows = [[w.worker, w.node, w.num_rows, w.num_started, w.num_unrecorded,
             f"lost: it {w.lost}" if w.lost is not None else "finished"] for w in info.workers]
    return table(["worker", "Locust node", "requests recorded", "requests sent", "sent, not recorded", "state"],
                 rows, caption="The load workers, as their master saw them (a lost worker's recorded requests "
                               "are in every figure; the load after it was lost came from the others)")


def prefix_cache_line(ctx: ReportContext) -> str:
    """Prompt tokens served from the prefix cache: per the engine's steps, and per the responses' usage."""
    server = ctx.facts.server.prefix_hit_rate if ctx.facts.server is not None else None
    parts = [f"{server:.1%} of prefill tokens (engine steps)"] if server is not None else []
    rows = ctx.focus.client
    if rows is not None and len(rows) and "num_cached_tokens" in rows:
        measured = rows[~rows["is_warmup"] & rows["num_cached_tokens"].notna()]
        prompt = float(measured["num_prompt_tokens"].sum())
        if prompt:
            parts.append(f"{float(measured['num_cached_tokens'].sum()) / prompt:.1%} of prompt tokens "
                         f"(usage.prompt_tokens_details.cached_tokens)")
    return "; ".join(parts) or "not reported by this server"

