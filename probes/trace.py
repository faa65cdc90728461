"""Export a run as a Chrome / Perfetto JSON trace (open it at ui.perfetto.dev or chrome://tracing).

- engine steps: complete slices (``ph: "X"``) named ``step``, their phases nested inside;
- requests: nestable async slices (``ph: "b"`` / ``"e"``), one id per request, with ``queued``,
  ``prefill`` and ``decode`` nested inside;
- counters (``ph: "C"``): batch size and queues, tokens per step, KV cache usage, GPU and host load.

Timestamps are microseconds since the earliest time in the run (``otherData.time_origin_unix_s``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

from probes.loader import RunData, load_run
from probes.run_dir import TRACE_NAME, RunDirectory

PID_ENGINE = 1
PID_HOST = 2
PID_GPU = 3
TID_STEPS = 1
# NOTE: the order the engine runs them in; the nested phase slices tile their step exactly.
# The step phases (STEPS columns) in the order they run within a step, as the trace draws them.
PHASES_IN_RUN_ORDER = ("schedule_s", "host_overhead_s", "prepare_s", "forward_s", "sample_s", "output_s")

Event = dict[str, Any]


def export_trace(path: str | os.PathLike[str]) -> Path:
    """Write ``trace.json`` into the run directory at ``path`` (a crashed run's too) and return its path."""
    run = load_run(path)
    return RunDirectory(path).write_json(TRACE_NAME, build_trace(run), indent=None)


def build_trace(run: RunData) -> dict[str, Any]:
    """The run as a Trace Event Format JSON object."""
    origin = _time_origin(run)
    events: list[Event] = [
        _meta("process_name", PID_ENGINE, {"name": "engine"}),
        _meta("thread_name", PID_ENGINE, {"name": "steps"}, tid=TID_STEPS),
        _meta("process_name", PID_HOST, {"name": "host"}),
        _meta("process_name", PID_GPU, {"name": "gpu"}),
    ]
    frames = run.frames
    if "steps" in frames:
        events += _step_events(frames["steps"], origin)
    if "requests" in frames:
        events += _request_events(frames["requests"], origin)
    if "host" in frames:
        events += _counters(frames["host"], origin, PID_HOST, lambda r: {
            "host cpu": {"process_pct": r["process_cpu_pct"], "system_pct": r["system_cpu_pct"]},
            "host memory": {"rss_mib": r["process_rss_bytes"] / 2**20},
        })
    if "nvml" in frames:
        events += _counters(frames["nvml"], origin, PID_GPU, lambda r: {
            f"gpu{r['gpu_index']} utilization": {"gpu_pct": r["gpu_util_pct"], "memory_pct": r["mem_util_pct"]},
            f"gpu{r['gpu_index']} memory": {"used_gib": r["mem_used_bytes"] / 2**30},
            f"gpu{r['gpu_index']} power": {"watts": r["power_w"]},
            f"gpu{r['gpu_index']} sm clock": {"mhz": r["sm_clock_mhz"]},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"time_origin_unix_s": origin, "run": run.path.name, "model": run.manifest.model}}


def _step_events(steps: pd.DataFrame, origin: float) -> list[Event]:
    events: list[Event] = []
    for row in steps.to_dict("records"):
        start = _us(row["start_time"], origin)
        edges = [start]
        for phase in PHASES_IN_RUN_ORDER:
            edges.append(edges[-1] + row[phase] * 1e6)
        args = {k: row[k] for k in ("step_index", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
                                    "num_running", "num_waiting", "num_preemptions", "num_prefix_hit_tokens")}
        events.append({"ph": "X", "name": "step", "cat": "engine", "pid": PID_ENGINE, "tid": TID_STEPS,
                       "ts": start, "dur": edges[-1] - start, "args": args})
        for phase, begin, end in zip(PHASES_IN_RUN_ORDER, edges, edges[1:], strict=False):
            if end > begin:
                events.append({"ph": "X", "name": phase.removesuffix("_s"), "cat": "engine", "pid": PID_ENGINE,
                               "tid": TID_STEPS, "ts": begin, "dur": end - begin})
        num_blocks = row["num_kv_blocks_used"] + row["num_kv_blocks_free"]
        counters = {
            "batch": {"num_seqs": row["num_seqs"], "num_running": row["num_running"],
                      "num_waiting": row["num_waiting"]},
            "tokens per step": {"prefill": row["num_prefill_tokens"], "decode": row["num_decode_tokens"]},
            "kv cache": {"usage_pct": 100.0 * row["num_kv_blocks_used"] / num_blocks if num_blocks else 0.0,
                         "cached_free_blocks": row["num_kv_blocks_cached"]},
        }
        events += [_counter(name, PID_ENGINE, start, values) for name, values in counters.items()]
    return events


def _request_events(requests: pd.DataFrame, origin: float) -> list[Event]:
    events: list[Event] = []
    for async_id, row in enumerate(requests.to_dict("records"), start=1):
        times = {k: _json_safe(row[k]) for k in ("arrival_time", "first_scheduled_time", "first_token_time",
                                             "finish_time")}
        known = [t for t in times.values() if t is not None]
        if not known:
            continue
        begin = times["arrival_time"] if times["arrival_time"] is not None else min(known)
        end = times["finish_time"] if times["finish_time"] is not None else max(known)
        args = {"request_id": row["request_id"], "finish_reason": _json_safe(row["finish_reason"]),
                "num_prompt_tokens": row["num_prompt_tokens"], "num_output_tokens": row["num_output_tokens"],
                "num_cached_tokens": row["num_cached_tokens"], "num_preemptions": row["num_preemptions"],
                "ttft_ms": _ms(row["ttft_s"]), "tpot_ms": _ms(row["tpot_s"]), "e2e_ms": _ms(row["e2e_s"])}
        children = [("queued", times["arrival_time"], times["first_scheduled_time"]),
                    ("prefill", times["first_scheduled_time"], times["first_token_time"]),
                    ("decode", times["first_token_time"], times["finish_time"])]
        common = {"cat": "request", "id": async_id, "pid": PID_ENGINE, "tid": TID_STEPS}
        events.append({**common, "ph": "b", "name": "request", "ts": _us(begin, origin), "args": args})
        for name, child_begin, child_end in children:
            # NOTE: empty phases are left out: a "b" and an "e" at one timestamp may be reordered.
            if child_begin is None or child_end is None or not begin <= child_begin < child_end <= end:
                continue
            events.append({**common, "ph": "b", "name": name, "ts": _us(child_begin, origin)})
            events.append({**common, "ph": "e", "name": name, "ts": _us(child_end, origin)})
        events.append({**common, "ph": "e", "name": "request", "ts": _us(end, origin)})
    # NOTE: each request's events are emitted in nesting order; a stable sort by time keeps it.
    return sorted(events, key=lambda e: e["ts"])


def _counters(frame: pd.DataFrame, origin: float, pid: int, series: Any) -> list[Event]:
    events = []
    for row in frame.to_dict("records"):
        ts = _us(row["time"], origin)
        for name, values in series(row).items():
            event = _counter(name, pid, ts, values)
            if event["args"]:
                events.append(event)
    return events


def _counter(name: str, pid: int, ts: float, values: dict[str, Any]) -> Event:
    return {"ph": "C", "name": name, "pid": pid, "ts": ts,
            "args": {k: v for k, v in ((k, _json_safe(v)) for k, v in values.items()) if v is not None}}


def _meta(name: str, pid: int, args: dict[str, Any], tid: int = 0) -> Event:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _time_origin(run: RunData) -> float:
    candidates = [run.manifest.started_at]
    for name, column in (("steps", "start_time"), ("requests", "arrival_time"), ("host", "time"),
                         ("nvml", "time")):
        frame = run.frames.get(name)
        if frame is not None and len(frame) and frame[column].notna().any():
            candidates.append(float(frame[column].min()))
    return min(candidates)


def _us(t: float, origin: float) -> float:
    return (t - origin) * 1e6


def _ms(seconds: Any) -> float | None:
    value = _json_safe(seconds)
    return None if value is None else value * 1e3


def _json_safe(value: Any) -> Any:
    """A JSON-safe value: ``None`` for nulls and NaN (how pandas marks a missing float or string)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value) if isinstance(value, float) else value
