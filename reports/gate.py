"""`servescope gate`: a CI gate for what wall-clock statistics cannot carry across machines.

Two kinds of checks, each a row of metric, baseline, current, threshold and verdict:
- ratios measured side by side in one run (engine / naive throughput, paged / contiguous capacity,
  paged KV waste, probe overhead) against floors from a checked-in TOML file;
- serving figures of a current run directory against a baseline run directory (TTFT, TPOT, E2E,
  throughput, goodput), each allowed a relative regression.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from reports.compare import FIGURES, compare, is_regression

DEFAULT_FLOORS = "gate_floors.toml"


@dataclass(frozen=True, slots=True)
class GateRow:
    """One check; ``baseline`` is the floor/ceiling for ratios, the baseline run's value for serving."""

    metric: str
    baseline: float | None
    current: float | None
    threshold: str
    passed: bool


def load_floors(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    if path is None:
        return tomllib.loads(resources.files("reports").joinpath(DEFAULT_FLOORS).read_text())
    return tomllib.loads(Path(path).read_text())


def bench_ratios(bench: dict[str, Any]) -> dict[str, float]:
    """The gated ratios a `servescope bench --json` report holds (those its engines allow)."""
    engines = bench["engines"]
    out: dict[str, float] = {}
    cont = engines.get("continuous")
    if cont and "naive" in engines:
        out["continuous_over_naive"] = cont["output_tokens_per_s"] / engines["naive"]["output_tokens_per_s"]
    if cont and "contiguous" in engines and engines["contiguous"]["peak_concurrent_seqs"]:
        out["paged_over_contiguous_capacity"] = (cont["peak_concurrent_seqs"]
                                                 / engines["contiguous"]["peak_concurrent_seqs"])
    if cont:
        out["paged_kv_waste"] = cont["kv_waste_fraction"]
    return out


def probe_ratio(benchmark_json: dict[str, Any]) -> dict[str, float]:
    """``probe_overhead`` from pytest-benchmark's JSON (the default-pool probe-overhead benchmark)."""
    for bench in benchmark_json.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if "probe_overhead" in info and info.get("pool", "default-kv-pool") == "default-kv-pool":
            return {"probe_overhead": float(info["probe_overhead"])}
    return {}


def gate_ratios(ratios: dict[str, float], floors: dict[str, Any]) -> list[GateRow]:
    rows = []
    for metric, bound in floors.get("ratios", {}).items():
        value = ratios.get(metric)
        if value is None:
            continue  # this run did not measure it
        if "min" in bound:
            rows.append(GateRow(metric, bound["min"], value, f">= {bound['min']:g}", value >= bound["min"]))
        if "max" in bound:
            rows.append(GateRow(metric, bound["max"], value, f"<= {bound['max']:g}", value <= bound["max"]))
    return rows


def gate_serving(baseline_dir: str | os.PathLike[str], current_dir: str | os.PathLike[str],
                 floors: dict[str, Any]) -> list[GateRow]:
    """Each configured figure of the current run may be worse than the baseline's by the given share."""
    comparison = compare([baseline_dir, current_dir], ["baseline", "current"])
    base, current = comparison.runs
    better = {f.key: f.better for f in FIGURES}
    rows = []
    for metric, allowed in floors.get("serving", {}).items():
        if metric not in better:
            raise ValueError(f"unknown serving figure {metric!r}; known: {', '.join(better)}")
        b, c = base.values[metric], current.values[metric]
        if b is None or c is None:
            continue
        regressed = is_regression(current.deltas[metric], allowed)
        direction = "lower" if better[metric] == "lower" else "higher"
        rows.append(GateRow(metric, b, c, f"{direction} is better; <= {allowed:.0%} worse", not regressed))
    return rows


def run_gate(floors_path: str | None, bench_json: str | None, probe_json: str | None,
             baseline_dir: str | None, current_dir: str | None) -> list[GateRow]:
    floors = load_floors(floors_path)
    ratios: dict[str, float] = {}
    if bench_json:
        ratios.update(bench_ratios(json.loads(Path(bench_json).read_text())))
    if probe_json:
        ratios.update(probe_ratio(json.loads(Path(probe_json).read_text())))
    rows = gate_ratios(ratios, floors)
    if baseline_dir and current_dir:
        rows += gate_serving(baseline_dir, current_dir, floors)
    if not rows:
        raise ValueError("nothing to gate: give --bench, --probe-bench, or --baseline with --current")
    return rows


def format_rows(rows: list[GateRow]) -> str:
    """A plain table for CI logs: metric, baseline, current, threshold, verdict."""
    header = ("metric", "baseline", "current", "threshold", "verdict")
    body = [(r.metric, _num(r.baseline), _num(r.current), r.threshold, "pass" if r.passed else "FAIL") for r in rows]
    widths = [max(len(str(row[i])) for row in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) for row in (header, *body)]
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
