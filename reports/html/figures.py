"""Plotly figures of a run: timelines, latency CDFs, goodput, step-time breakdown, concurrency, roofline.

Figures never carry request text (prompts, errors): those go in the report's escaped tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probes.peaks import MachinePeaks
from probes.schemas import STEP_PHASES
from reports.dataset import RunDataset
from reports.measures import WAIT_LIMITS, ServerMeasures
from reports.metric_adapters import metrics_adapter, signal_series
from reports.summary import PointMeasures

# Steps are averaged into at most this many time bins, so a long run stays a small file.
MAX_TIMELINE_POINTS = 600
LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"))
_LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 40}}


def _t0(data: RunDataset) -> float:
    start = data.window[0]
    if math.isfinite(start):
        return start
    steps = data.frame("steps")
    return float(steps["start_time"].min()) if len(steps) else 0.0


def _binned(times: np.ndarray, values: pd.DataFrame, span: float) -> pd.DataFrame:
    """Mean of each column over equal time bins (the raw rows when they are few)."""
    if len(times) <= MAX_TIMELINE_POINTS or span <= 0:
        return values.assign(t=times)
    width = span / MAX_TIMELINE_POINTS
    bins = np.floor((times - times.min()) / width)
    out = values.groupby(bins).mean()
    out["t"] = times.min() + (out.index.to_numpy() + 0.5) * width
    return out.reset_index(drop=True)


def timeline_figure(data: RunDataset) -> go.Figure | None:
    """Users (when they changed), batch size, waiting queue, KV usage and utilization over the run
    (seconds from the measured start)."""
    t0 = _t0(data)
    rows: list[tuple[str, list[go.Scatter]]] = []
    users = _users_trace(data, t0)
    if users is not None:
        rows.append(("users", [users]))
    steps = data.frame("steps").sort_values("start_time")
    if len(steps):
        times = steps["start_time"].to_numpy() - t0
        pool = (steps["num_kv_blocks_used"] + steps["num_kv_blocks_free"]).replace(0, np.nan)
        frame = _binned(times, pd.DataFrame({
            "batch": steps["num_seqs"], "waiting": steps["num_waiting"], "running": steps["num_running"],
            "kv": 100 * steps["num_kv_blocks_used"] / pool}), times.max() - times.min())
        rows.append(("batch size", [go.Scatter(x=frame["t"], y=frame["batch"], name="sequences per step")]))
        rows.append(("waiting", [go.Scatter(x=frame["t"], y=frame["waiting"], name="requests waiting")]))
        if frame["kv"].notna().any():
            rows.append(("KV usage %", [go.Scatter(x=frame["t"], y=frame["kv"], name="KV blocks in use %")]))
        rows.append(("utilization %", [_engine_busy_trace(steps, t0), *_host_traces(data, t0)]))
    else:
        adapter = metrics_adapter(data)
        for signal, title in (("running", "running"), ("waiting", "waiting")):
            sample, series = signal_series(data, adapter, signal) if adapter is not None else (None, None)
            if series is not None:
                rows.append((title, [go.Scatter(x=series.index - t0, y=series.values, name=sample)]))
        usage = signal_series(data, adapter, "kv_usage")[1] if adapter is not None else None
        if usage is not None:
            rows.append(("KV usage %", [go.Scatter(x=usage.index - t0, y=100 * usage.values, name="KV cache usage")]))
        in_flight = _in_flight_trace(data, t0)
        if in_flight is not None:
            rows.append(("in flight", [in_flight]))
        host = _host_traces(data, t0)
        if host:
            rows.append(("utilization %", host))
    if not rows:
        return None
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[title for title, _ in rows])
    for i, (_, traces) in enumerate(rows, start=1):
        for trace in traces:
            fig.add_trace(trace, row=i, col=1)
    fig.update_xaxes(title_text="seconds from the measured start", row=len(rows), col=1)
    fig.update_layout(height=170 * len(rows) + 80, **_LAYOUT)
    return fig


def _users_trace(data: RunDataset, t0: float) -> go.Scatter | None:
    """Locust's user count over the run, when it changed during it (a plain Locust run's web UI steps)."""
    steps = (data.load_info.users_timeline if data.load_info is not None else None) or []
    if len({step["users"] for step in steps}) < 2:
        return None
    times = [float(step["time"]) - t0 for step in steps]
    return go.Scatter(x=times, y=[step["users"] for step in steps], name="Locust users", line_shape="hv")


def _engine_busy_trace(steps: pd.DataFrame, t0: float) -> go.Scatter:
    """Share of each time bin the engine spent inside a step."""
    start = steps["start_time"].to_numpy() - t0
    span = float((start + steps["total_s"].to_numpy()).max() - start.min())
    width = max(span / min(MAX_TIMELINE_POINTS, 200), 0.05)
    bins = np.floor((start - start.min()) / width)
    busy = steps["total_s"].groupby(bins).sum().reindex(np.arange(bins.max() + 1), fill_value=0.0)
    return go.Scatter(x=start.min() + (busy.index + 0.5) * width, y=np.minimum(100 * busy.values / width, 100),
                      name="engine busy %")


def _host_traces(data: RunDataset, t0: float) -> list[go.Scatter]:
    traces = []
    host = data.frame("host")
    if len(host):
        traces.append(go.Scatter(x=host["time"] - t0, y=host["process_cpu_pct"], name="process CPU % (100 = 1 core)"))
    nvml = data.frame("nvml")
    for gpu, rows in nvml.groupby("gpu_index"):
        traces.append(go.Scatter(x=rows["time"] - t0, y=rows["gpu_util_pct"], name=f"GPU {gpu} util %"))
    return traces


def _in_flight_trace(data: RunDataset, t0: float) -> go.Scatter | None:
    rows = data.latencies.dropna(subset=["start_time"])
    if rows.empty:
        return None
    events = pd.concat([pd.Series(1, index=rows["start_time"]), pd.Series(-1, index=rows["end_time"].dropna())])
    counts = events.sort_index().cumsum()
    return go.Scatter(x=counts.index - t0, y=counts.values, name="requests in flight (client)", line_shape="hv")


def latency_cdf_figure(points: Sequence[RunDataset]) -> go.Figure | None:
    """Empirical CDFs of TTFT, TPOT, ITL and E2E, one line per load point."""
    if all(p.latencies.empty for p in points):
        return None
    fig = make_subplots(rows=2, cols=2, subplot_titles=[f"{name} CDF" for _, name in LATENCIES])
    for i, point in enumerate(points):
        ok = point.latencies[point.latencies["is_ok"].astype(bool)]
        for j, (column, name) in enumerate(LATENCIES):
            if column == "itl_s":
                values = np.array([g for gaps in ok[column] if gaps is not None for g in gaps], dtype=float)
            else:
                values = ok[column].dropna().to_numpy(dtype=float)
            if values.size == 0:
                continue
            values = np.sort(values) * 1000
            if values.size > 2000:  # NOTE: the CDF's shape survives even quantile sampling
                values = np.quantile(values, np.linspace(0, 1, 2000))
            fig.add_trace(go.Scatter(x=values, y=np.linspace(0, 1, values.size), name=f"{point.label} {name}",
                                     legendgroup=point.label, showlegend=j == 0 or len(points) == 1,
                                     line={"color": _color(i)}), row=j // 2 + 1, col=j % 2 + 1)
    fig.update_xaxes(title_text="ms", type="log")
    fig.update_yaxes(range=[0, 1])
    fig.update_layout(height=620, **_LAYOUT)
    return fig


def goodput_figure(point: RunDataset, slo: dict[str, float]) -> go.Figure | None:
    """Good requests per second as the TTFT bound varies (other SLO bounds held)."""
    rows = point.latencies
    if rows.empty or not point.window_s:
        return None
    ok = rows["is_ok"].astype(bool)
    for metric, bound in slo.items():
        if metric != "ttft":
            ok &= rows[f"{metric}_s"].isna() | (rows[f"{metric}_s"] <= bound)
    ttft = rows.loc[ok, "ttft_s"].dropna().to_numpy()
    if ttft.size == 0:
        return None
    bounds = np.geomspace(max(ttft.min() / 2, 1e-4), ttft.max() * 2, 60)
    good = [(ttft <= b).sum() / point.window_s for b in bounds]
    fig = go.Figure(go.Scatter(x=bounds * 1000, y=good, name="good requests/s"))
    if "ttft" in slo:
        fig.add_vline(x=slo["ttft"] * 1000, line_dash="dash", annotation_text="SLO TTFT")
    fig.update_layout(xaxis_title="TTFT bound (ms)", yaxis_title="good requests / s", xaxis_type="log",
                      height=360, **_LAYOUT)
    return fig


def step_breakdown_figure(steps: pd.DataFrame) -> go.Figure | None:
    """Mean time of each step phase, by batch size, split into decode-only and prefill steps."""
    if steps.empty:
        return None
    kind = np.where(steps["num_prefill_tokens"] > 0, "prefill", "decode")
    groups = steps.assign(kind=kind).groupby(["kind", "num_seqs"])[list(STEP_PHASES.values())].mean() * 1000
    labels = [f"{k} x{n}" for k, n in groups.index]
    fig = go.Figure([go.Bar(x=labels, y=groups[p], name=p.removesuffix("_s")) for p in STEP_PHASES.values()])
    fig.update_layout(barmode="stack", xaxis_title="step kind x batch size", yaxis_title="mean ms per step",
                      height=380, **_LAYOUT)
    return fig


def wait_limits_figure(server: ServerMeasures) -> go.Figure | None:
    """Which limit held the waiting requests out of the batch, as shares of the waiting time."""
    if server.waiting_share <= 0:
        return None
    fig = go.Figure(go.Bar(x=[100 * server.wait_limits[k] for k in WAIT_LIMITS], y=list(WAIT_LIMITS),
                           orientation="h"))
    fig.update_layout(xaxis_title="% of the time requests waited", height=240, **_LAYOUT)
    return fig


def concurrency_figure(points: Sequence[PointMeasures], parameter: str) -> go.Figure | None:
    """Output throughput and median TTFT/TPOT against the swept load."""
    xs = [p.concurrency for p in points]
    if len(points) < 2 or any(x is None for x in xs):
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    tput = [p.client.output_throughput if p.client else None for p in points]
    fig.add_trace(go.Scatter(x=xs, y=tput, name="output tokens/s", mode="lines+markers"), secondary_y=False)
    for key, name in (("ttft_s", "TTFT p50 (ms)"), ("tpot_s", "TPOT p50 (ms)")):
        dists = [getattr(p.client, key) if p.client else None for p in points]
        ys = [d["p50"] if d else None for d in dists]
        fig.add_trace(go.Scatter(x=xs, y=[y * 1000 if y is not None else None for y in ys], name=name,
                                 mode="lines+markers", line={"dash": "dot"}), secondary_y=True)
    fig.update_xaxes(title_text=parameter)
    fig.update_yaxes(title_text="output tokens / s", secondary_y=False)
    fig.update_yaxes(title_text="ms", type="log", secondary_y=True)
    fig.update_layout(height=400, **_LAYOUT)
    return fig


def roofline_figure(work: pd.DataFrame, peaks: MachinePeaks | None) -> go.Figure | None:
    """Each step's arithmetic intensity against its achieved FLOP/s, under the machine's two roofs."""
    if work.empty:
        return None
    fig = go.Figure()
    sample = work if len(work) <= 3000 else work.sample(3000, random_state=0)
    for i, (kind, rows) in enumerate(sample.groupby("kind")):
        fig.add_trace(go.Scatter(x=rows["intensity"], y=rows["flops_per_s"], mode="markers", name=f"{kind} steps",
                                 marker={"size": 5, "opacity": 0.5, "color": _color(i)}))
    if peaks is not None:
        lo = min(float(work["intensity"].min()), peaks.ridge_intensity) / 4
        hi = max(float(work["intensity"].max()), peaks.ridge_intensity) * 4
        xs = np.geomspace(lo, hi, 100)
        fig.add_trace(go.Scatter(x=xs, y=np.minimum(xs * peaks.bandwidth_bytes_per_s, peaks.flops_per_s),
                                 name=f"roof ({peaks.device})", line={"color": "black"}))
    fig.update_layout(xaxis_title="FLOPs per byte moved", yaxis_title="achieved FLOP/s", xaxis_type="log",
                      yaxis_type="log", height=420, **_LAYOUT)
    return fig


def _color(i: int) -> str:
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
    return palette[i % len(palette)]
