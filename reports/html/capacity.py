"""The report's first section after a capacity search: the capacity, what limits it, and the curve with its fit."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reports.capacity.bootstrap import weights_of
from reports.capacity.knee import KneeFit
from reports.capacity.limit import LIMIT_BOTTLENECK
from reports.capacity.other_load import BUSY_CORES
from reports.capacity.records import Capacity
from reports.capacity.saturation import PLATEAU_SHARE, monotone_fit
from reports.html.sections import Block, ReportContext, Section, note, table
from reports.levers.engine_speed import SLOWED_FACTOR

_LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 40}}


def headline(capacity: dict[str, Any]) -> list[str]:
    """The capacity and what limits it, in sentences (the console and the report lead with these)."""
    n, tput, good = capacity["concurrency"], capacity["output_tokens_per_s"], capacity["goodput"]
    level = saturation_words(capacity)
    if n is None:
        first = f"Capacity: not found ({capacity['reason']})" + (f"; {level}" if level else "")
    else:
        goodput = f", goodput {good:.3g} good requests/s" if good is not None else ""
        first = (f"Capacity: {n} concurrent users{users_range(capacity.get('interval'))}, "
                 f"{rate_words(tput, capacity.get('output_tokens_per_s_interval'))} output tokens/s there{goodput}"
                 f"{'; ' + level if level else ''} ({capacity['reason']})")
    limit = capacity["limit"]
    if limit:
        second = f"What limits it: {limit} ({LIMIT_BOTTLENECK[limit]}): {capacity['limit_evidence']}"
    elif capacity.get("probed"):
        second = f"What limits it: {capacity['limit_evidence']}"
    else:
        second = f"What limits it: not determined from the outside: {capacity['limit_evidence']}"
    lines = [first, second]
    busy = [p for p in capacity["points"] if (p.get("other_cpu_cores") or 0) >= BUSY_CORES]
    if busy:
        lines.append("Measured on a busy machine: other processes took " + ", ".join(
            f"{p['other_cpu_cores']:.1f} cores at {p['users']} users" for p in busy)
            + "; those points read low, and a rerun on a quiet machine may not agree")
    slowed = [p for p in capacity["points"] if (p.get("engine_slowdown") or 0) >= SLOWED_FACTOR]
    if slowed:
        lines.append("The host ran the engine slower under some points: " + ", ".join(
            f"at {p['users']} users its decode steps took {p['engine_load_factor']:.2f}x their calibrated time, "
            f"{p['engine_slowdown']:.2f}x the search's median point" for p in slowed)
            + " (against the calibration at the same batch sizes: the machine ran the same work slower); "
            + ("those points read" if len(slowed) > 1 else "that point reads") + " low, and a rerun may not agree")
    single = capacity.get("single_stream")
    if single is not None and single.get("mbu") is not None:
        lines.append(f"One stream reads the weights at {single['mbu']:.0%} of this machine's copy bandwidth "
                     f"({single['weight_bytes'] / 1e6:.0f} MB per token at TPOT {single['tpot_s'] * 1000:.1f} ms, "
                     f"bandwidth {single['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)")
    elif single is not None:
        lines.append(f"Single-stream bandwidth use: unknown ({single.get('why_not')})")
    return lines


def users_range(interval: dict[str, Any] | None) -> str:
    """`` (8-16)``: the capacity's range in users at its confidence, or nothing without one."""
    if interval is None:
        return ""
    return f" ({interval['low']}-{interval['high']})"


def saturation_words(capacity: dict[str, Any]) -> str:
    """``saturates at 104 (99-109) output tokens/s``: the curve's level with its range, or nothing without one."""
    level = capacity.get("saturation_tokens_per_s")
    if level is None:
        return ""
    span = capacity.get("saturation_tokens_per_s_interval")
    return f"saturates at {level:.4g}" + (f" ({span['low']:.4g}-{span['high']:.4g})" if span else "") + " output tokens/s"


def rate_words(value: float | None, interval: dict[str, Any] | None) -> str:
    """``110 ± 4``: a throughput and half its interval's width, or the value alone without one."""
    if value is None:
        return "-"
    if interval is None:
        return f"{value:.4g}"
    return f"{value:.4g} ± {interval['high'] - interval['value']:.2g}"  # the top: a low end may be cut at zero


def capacity_figure(capacity: Capacity) -> go.Figure | None:
    """Output throughput at each searched point, its non-decreasing fit and saturation level, the two-segment fit,
    the capacity, and SLO attainment."""
    points = [p for p in capacity.points if p.output_tokens_per_s is not None]
    if not points:
        return None
    has_slo = any(p.slo_attainment is not None for p in points)
    fig = make_subplots(specs=[[{"secondary_y": has_slo}]])
    xs = [p.users for p in points]
    intervals = [p.output_tokens_per_s_interval for p in points]
    error_y = None
    if any(i is not None for i in intervals):
        error_y = {"type": "data", "symmetric": False,
                   "array": [i["high"] - p.output_tokens_per_s if i else 0 for p, i in zip(points, intervals, strict=True)],
                   "arrayminus": [p.output_tokens_per_s - i["low"] if i else 0
                                  for p, i in zip(points, intervals, strict=True)]}
    fig.add_trace(go.Scatter(x=xs, y=[p.output_tokens_per_s for p in points], mode="markers",
                             name="measured (95% interval)" if error_y else "measured", marker={"size": 9},
                             error_y=error_y), secondary_y=False)
    weights = weights_of([p.interval for p in points])
    fig.add_trace(go.Scatter(x=xs, y=monotone_fit([p.output_tokens_per_s for p in points], weights), mode="lines",
                             name="non-decreasing fit (weighted)" if weights else "non-decreasing fit"),
                  secondary_y=False)
    fit = _fit_trace(capacity.knee, xs)
    if fit is not None:
        fig.add_trace(fit, secondary_y=False)
    if capacity.saturation_tokens_per_s is not None:
        fig.add_hline(y=capacity.saturation_tokens_per_s, line_dash="dot",
                      annotation_text=f"saturates at {capacity.saturation_tokens_per_s:.4g}")
        fig.add_hline(y=PLATEAU_SHARE * capacity.saturation_tokens_per_s, line_dash="dot", line_color="grey",
                      annotation_text=f"{PLATEAU_SHARE:.0%} of it", annotation_position="bottom right")
    if capacity.interval is not None and capacity.interval["low"] != capacity.interval["high"]:
        fig.add_vrect(x0=capacity.interval["low"], x1=capacity.interval["high"], fillcolor="grey", opacity=0.12,
                      line_width=0, annotation_text=f"capacity {capacity.interval['confidence']:.0%} range",
                      annotation_position="bottom right")
    if capacity.concurrency is not None:
        fig.add_vline(x=capacity.concurrency, line_dash="dash", annotation_text=f"capacity {capacity.concurrency}")
    if has_slo:
        rated = [p for p in points if p.slo_attainment is not None]
        att = [p.slo_attainment for p in rated]
        fig.add_trace(go.Scatter(
            x=[p.users for p in rated], y=[a["value"] for a in att], mode="markers", name="SLO attainment",
            error_y={"type": "data", "symmetric": False, "array": [a["high"] - a["value"] for a in att],
                     "arrayminus": [a["value"] - a["low"] for a in att]}), secondary_y=True)
        fig.update_yaxes(title_text="SLO attainment (95% Wilson)", range=[0, 1.05], secondary_y=True)
    fig.update_xaxes(title_text="concurrent users")
    fig.update_yaxes(title_text="output tokens / s", secondary_y=False)
    fig.update_layout(height=400, **_LAYOUT)
    return fig


def _fit_trace(knee: KneeFit, xs: list[int]) -> go.Scatter | None:
    if knee.breakpoint is None:
        return None
    grid = np.linspace(min(xs), max(xs), 200)
    label = "two-segment fit" + ("" if knee.has_knee else " (no knee)")
    return go.Scatter(x=grid, y=[knee.predict(float(x)) for x in grid], mode="lines", name=label,
                      line={"dash": "dot" if not knee.has_knee else "solid"})


class CapacitySection(Section):
    anchor, title = "capacity", "Capacity"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        capacity = ctx.capacity
        if capacity is None:
            return [note("No capacity search in this run (it had --users, --rate or --sweep); without them "
                         "`servescope diagnose` and `load` search for the server's capacity.")]
        out: list[Block | None] = [note(line) for line in headline(capacity.to_dict())]
        out.append(note(f"Verdict read at {ctx.focus.label}: {_why_there(capacity, ctx.diagnosis.metrics)}. "
                        f"Search: {capacity.stopped}."))
        rows = [[p.users, p.output_tokens_per_s, _rate_range(p.output_tokens_per_s_interval), p.measured_s,
                 (p.window or {}).get("why_stopped"), p.decoding_streams, p.in_flight, p.tokens_per_request,
                 _attainment(p.slo_attainment), p.goodput, p.engine_load_factor] for p in capacity.points]
        out.append(table(["users", "output tok/s (streamed in the window)", "95% interval", "measured s",
                          "why it stopped", "decoding streams", "requests open", "tokens per request",
                          "SLO attainment (95% CI)", "goodput req/s", "engine's decode time over its calibration"],
                         rows,
                         highlight=[p.users == capacity.concurrency for p in capacity.points]))
        out.append(ctx.figure(capacity_figure(capacity), f"The capacity: {capacity.reason}. Knee fit (the bend, "
                                                         f"drawn for reading): {capacity.knee.reason}"))
        t = capacity.tokens
        if t is not None:
            out.append(table(["users", "tokens per request (x)", "decoding streams (x)", "exponent", "limit"],
                             [[t.users, t.token_ratio, t.streams_ratio, t.exponent, t.limit]],
                             caption="Tokens experiment: the capacity point rerun with more tokens per request; "
                                     "exponent 0: the same number of streams (seats), 1: streams fall in "
                                     "proportion (memory)"))
        return out


def _why_there(capacity: Capacity, metrics: dict[str, Any]) -> str:
    """Why the verdict was read at its point (reports.capacity.result.focus_users, then reports.verdict.diagnosis)."""
    moved = metrics.get("verdict_point")
    if moved:
        return moved["why"]
    if capacity.failed_at_users is not None:
        return "where requests began to fail from overload (their failures say which limit)"
    if capacity.past_knee_users is not None and capacity.concurrency is None:
        return ("the first point past the measured curve's own capacity estimate (no capacity was named: the points "
                "cannot be told apart), where the limit most likely binds")
    if capacity.past_knee_users is not None:
        return "the first point past the capacity, where its limit binds (at the capacity itself it only starts to)"
    return "the capacity point" if capacity.concurrency is not None else "the heaviest point"


def _rate_range(i: dict[str, Any] | None) -> str | None:
    return None if i is None else f"{i['low']:.4g}-{i['high']:.4g}"


def _attainment(a: dict[str, float] | None) -> str | None:
    return None if a is None else f"{a['value']:.0%} ({a['low']:.0%}-{a['high']:.0%})"

