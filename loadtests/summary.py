"""The measured summary of a run directory (or a sweep of them): latencies, throughput, goodput, server state.

``write_summary(out_dir)`` writes ``summary.json`` (what was measured, and whether the client,
Locust and the server counted the same requests), then hands the directory to the report package
for ``diagnosis.json`` and ``report.html``. Without that package the two hold the measurements
alone and the verdict is ``"undetermined"``, never a guess.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadtests.client_table import load_client_requests
from loadtests.locust_runner import read_locust_stats
from probes.run_dir import MANIFEST_NAME, RunDirectory
from reports.measures import distribution, goodput

LOAD_NAME = "load.json"
SWEEP_NAME = "sweep.json"
SUMMARY_NAME = "summary.json"
DIAGNOSIS_NAME = "diagnosis.json"
REPORT_NAME = "report.html"
TEMPLATE_NAME = "summary.html.jinja"
UNDETERMINED = "undetermined"
def point_metrics(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Every measured number of one load point's run directory (warm-up requests left out)."""
    run_dir = Path(run_dir)
    load = json.loads((run_dir / LOAD_NAME).read_text())
    rows = load_client_requests(run_dir)
    measured = rows[~rows["is_warmup"]]
    ok = measured[measured["is_ok"]]
    start = float(measured["send_time"].min()) if len(measured) else math.nan
    end = float(ok["end_time"].max()) if len(ok) else math.nan
    window_s = end - start if len(ok) else 0.0
    itl = [gap for gaps in ok["itl_s"] for gap in gaps]
    config = load["config"]
    metrics: dict[str, Any] = {
        "point": config["point"], "mode": config["mode"], "users": config["users"], "rate": config["rate"],
        "workload": config["workload"], "target": load.get("target"), "model": load.get("model"),
        "num_requests": len(measured), "num_ok": len(ok), "num_failed": len(measured) - len(ok),
        "num_warmup_requests": int(rows["is_warmup"].sum()),
        "window_s": window_s,
        "request_throughput_per_s": len(ok) / window_s if window_s > 0 else None,
        "output_throughput_tok_per_s": float(ok["num_output_tokens"].sum()) / window_s if window_s > 0 else None,
        "prompt_throughput_tok_per_s": float(ok["num_prompt_tokens"].sum()) / window_s if window_s > 0 else None,
        "ttft_s": distribution(ok["ttft_s"]), "tpot_s": distribution(ok["tpot_s"]),
        "itl_s": distribution(itl), "e2e_s": distribution(ok["e2e_s"]),
        "errors": measured.loc[~measured["is_ok"], "error"].fillna("").value_counts().head(5).to_dict(),
    }
    if config["mode"] == "open" and len(measured) > 1:
        sends = np.sort(measured["send_time"].to_numpy())
        metrics["open_loop"] = {
            "offered_rate_per_s": config["rate"],
            "achieved_send_rate_per_s": (len(sends) - 1) / float(sends[-1] - sends[0]),
            "send_lag_s": distribution(measured["send_time"] - measured["scheduled_time"]),
        }
    if config["slo"]:
        metrics["goodput"] = goodput(measured, config["slo"], window_s)
    server = server_metrics(run_dir, start, end) if (run_dir / MANIFEST_NAME).is_file() else None
    if server is not None:
        metrics["server"] = server
    metrics["accounting"] = accounting(run_dir, rows)
    return metrics


def server_metrics(run_dir: Path, start: float, end: float) -> dict[str, Any] | None:
    """What the probes saw during the measurement window: batch sizes, queue, KV use, steps."""
    from probes.loader import load_run

    run = load_run(run_dir)
    if "steps" not in run.frames:
        return None
    steps = run.frames["steps"]
    if math.isfinite(start) and math.isfinite(end):
        steps = steps[(steps["start_time"] >= start) & (steps["start_time"] <= end)]
    busy = steps[steps["num_seqs"] > 0]
    kv_total = steps["num_kv_blocks_used"] + steps["num_kv_blocks_free"]
    prefill_tokens = float(steps["num_prefill_tokens"].sum())
    hit_tokens = float(steps["num_prefix_hit_tokens"].sum())
    return {
        "num_steps": len(steps),
        "mean_batch_size": float(busy["num_seqs"].mean()) if len(busy) else None,
        "max_batch_size": int(busy["num_seqs"].max()) if len(busy) else None,
        "mean_num_waiting": float(steps["num_waiting"].mean()) if len(steps) else None,
        "max_num_waiting": int(steps["num_waiting"].max()) if len(steps) else None,
        "busy_fraction": float(busy["total_s"].sum()) / (end - start) if end > start else None,
        "mean_step_s": float(busy["total_s"].mean()) if len(busy) else None,
        "peak_kv_usage": float((steps["num_kv_blocks_used"] / kv_total).max()) if len(steps) else None,
        "num_preemptions": int(steps["num_preemptions"].sum()),
        "prefix_hit_rate": hit_tokens / (hit_tokens + prefill_tokens) if hit_tokens + prefill_tokens else None,
    }


def accounting(run_dir: Path, rows: pd.DataFrame) -> dict[str, Any]:
    """Requests as each side counted them, warm-up included: client rows, Locust's HTTP rows, the server."""
    out: dict[str, Any] = {"client_rows": len(rows)}
    stats_path = run_dir / "locust_stats.csv"
    if stats_path.is_file():
        stats = read_locust_stats(run_dir)
        http = stats[stats["Type"] == "POST"]
        out["locust_http_requests"] = int(http["Request Count"].sum())
        out["locust_http_failures"] = int(http["Failure Count"].sum())
    if (run_dir / MANIFEST_NAME).is_file():
        from probes.loader import load_run

        frames = load_run(run_dir).frames
        if "requests" in frames:
            out["server_finished_requests"] = int(frames["requests"]["is_finished"].sum())
        elif "prometheus" in frames:
            out["server_finished_requests"] = _prometheus_delta(frames["prometheus"], "vllm:request_success_total")
    counts = [v for k, v in out.items() if k in ("client_rows", "locust_http_requests", "server_finished_requests")]
    out["is_consistent"] = len(set(counts)) == 1
    return out


def _prometheus_delta(frame: pd.DataFrame, sample: str) -> int | None:
    """How much counter ``sample`` (summed over labels) grew from the first scrape to the last.

    NOTE: a labelled counter has no sample until its first increment, so a scrape without it counts 0.
    """
    if frame.empty:
        return None
    rows = frame[frame["sample"] == sample]
    scrapes = sorted(frame["scrape_index"].unique())
    per_scrape = rows.groupby("scrape_index")["value"].sum().reindex(scrapes, fill_value=0.0)
    return int(round(per_scrape.iloc[-1] - per_scrape.iloc[0]))


def summary_metrics(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """One point's metrics, or for a sweep directory ``{"sweep": ..., "points": [...]}``."""
    out_dir = Path(out_dir)
    sweep_path = out_dir / SWEEP_NAME
    if not sweep_path.is_file():
        return point_metrics(out_dir)
    sweep = json.loads(sweep_path.read_text())
    return {"sweep": {"parameter": sweep["parameter"], "values": sweep["values"]},
            "points": [point_metrics(out_dir / point["dir"]) for point in sweep["points"]]}


@dataclass(slots=True)
class Summary:
    """What :func:`write_summary` wrote: the measurements (``summary.json``) and the verdict (``diagnosis.json``)."""

    metrics: dict[str, Any]
    diagnosis: dict[str, Any]


def write_summary(out_dir: str | os.PathLike[str]) -> Summary:
    """Write ``summary.json`` (the measurements), then ``diagnosis.json`` and ``report.html``.

    The report package writes the last two (``reports.write_report``) when this install has it;
    otherwise they hold the measurements alone, with the verdict ``"undetermined"``.
    """
    out_dir = Path(out_dir)
    metrics = summary_metrics(out_dir)
    RunDirectory(out_dir).write_json(SUMMARY_NAME, _json_safe(metrics))
    write_report = _report_writer()
    if write_report is not None:
        return Summary(metrics, write_report(out_dir))
    return Summary(metrics, write_measurements_only(out_dir, metrics))


def _report_writer() -> Any:
    try:
        reports = importlib.import_module("reports")
    except ModuleNotFoundError as exc:
        if exc.name != "reports":
            raise
        return None
    return getattr(reports, "write_report", None)


def write_measurements_only(out_dir: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """``diagnosis.json`` and ``report.html`` from the measurements alone, for an install without reports."""
    import jinja2

    result = {"bottleneck": UNDETERMINED, "evidence": [], "metrics": metrics,
              "note": "no verdict: this install has no report package (reports.write_report); "
                      "these are the measurements alone"}
    RunDirectory(out_dir).write_json(DIAGNOSIS_NAME, _json_safe(result))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    points = metrics.get("points", [metrics])
    html = env.get_template(TEMPLATE_NAME).render(result=result, points=points, sweep=metrics.get("sweep"))
    (out_dir / REPORT_NAME).write_text(html, encoding="utf-8")
    return result


def _json_safe(value: Any) -> Any:
    """NaN and infinity become null (JSON has neither); numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
