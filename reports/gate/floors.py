"""`servescope gate`: a CI gate for what wall-clock statistics cannot carry across machines.

Two kinds of checks, each a row of metric, baseline, current, threshold and verdict:
- ratios measured side by side in one run (engine / naive throughput, paged / contiguous capacity,
  paged KV waste, probe overhead on every configuration the benchmark ran, decided on its interval)
  against floors from a checked-in TOML file;
- serving figures of a current run directory against a baseline run directory (TTFT, TPOT, E2E,
  throughput, goodput), each allowed a relative regression.

Every floor whose input is given must be checked: a floor that input cannot measure (an engine the
bench report lacks, a figure a run did not record) is an error, never a silent skip. The A/B gate
(two builds or configurations in one interleaved run) is ``reports.gate.verdict``.
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
from reports.gate.stats import estimate_slowdown

DEFAULT_FLOORS = "floors.toml"


@dataclass(frozen=True, slots=True)
class GateRow:
    """One check; ``baseline`` is the floor/ceiling for ratios, the baseline run's value for serving.

    A check measured over repeated cycles also carries its interval and the p-value of exceeding its bound.
    """

    metric: str
    baseline: float | None
    current: float | None
    threshold: str
    passed: bool
    interval: tuple[float, float] | None = None
    p_value: float | None = None


@dataclass(frozen=True, slots=True)
class GateResult:
    rows: list[GateRow]
    not_checked: list[str]  # floors whose input was not given, each with the flag that would give it


# ratio floor -> (the input that measures it, the bench engines it needs)
RATIO_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "continuous_over_naive": ("--bench", ("continuous", "naive")),
    "paged_over_contiguous_capacity": ("--bench", ("continuous", "contiguous")),
    "paged_kv_waste": ("--bench", ("continuous",)),
    "probe_overhead": ("--probe-bench", ()),
}
PROBE_POOL_DEFAULT = "default-kv-pool"


def load_floors(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    if path is None:
        floors = tomllib.loads(resources.files("reports.gate").joinpath(DEFAULT_FLOORS).read_text())
    else:
        floors = tomllib.loads(Path(path).read_text())
    unknown = sorted(set(floors.get("ratios", {})) - set(RATIO_SOURCES))
    if unknown:
        raise ValueError(f"unknown ratio checks {unknown} in the floors; known: {', '.join(RATIO_SOURCES)}")
    return floors


def bench_ratio(bench: dict[str, Any], metric: str) -> float:
    """One gated ratio of a `servescope bench --json` report; ValueError when the report cannot give it."""
    engines = bench.get("engines", {})
    needed = RATIO_SOURCES[metric][1]
    missing = [name for name in needed if name not in engines]
    if missing:
        raise ValueError(f"{metric}: the bench report has no {', '.join(missing)} engine "
                         f"(run servescope bench --engines {','.join(needed)})")
    cont = engines["continuous"]
    if metric == "continuous_over_naive":
        return cont["output_tokens_per_s"] / engines["naive"]["output_tokens_per_s"]
    if metric == "paged_over_contiguous_capacity":
        if not engines["contiguous"]["peak_concurrent_seqs"]:
            raise ValueError(f"{metric}: the contiguous engine ran no sequence")
        return cont["peak_concurrent_seqs"] / engines["contiguous"]["peak_concurrent_seqs"]
    return cont["kv_waste_fraction"]


def probe_rows(benchmark_json: dict[str, Any], bound: dict[str, float]) -> list[GateRow]:
    """One row per probe-overhead configuration in pytest-benchmark's JSON, each decided on its interval.

    The overhead of a configuration is estimated from its per-cycle ``probes / off`` round-time ratios;
    it fails when the whole interval lies above the ceiling, so one noisy cycle does not fail it.
    """
    if "max" not in bound:
        raise ValueError("probe_overhead takes a ceiling: probe_overhead = { max = 0.05 }")
    rows = []
    for bench in benchmark_json.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if "probe_overhead" not in info:
            continue
        config = info.get("pool", PROBE_POOL_DEFAULT)
        ratios = info.get("probe_overhead_ratios")
        if not ratios:
            raise ValueError(f"probe_overhead[{config}]: the benchmark JSON has no per-cycle ratios "
                             f"(probe_overhead_ratios); rerun tests/benchmarks/test_probe_overhead.py")
        s = estimate_slowdown(ratios, bound["max"])
        # NOTE: a pass whose interval still reaches above the ceiling is said to be unshown, not shown.
        shown = "shown below" if s.high <= bound["max"] else "not shown below, interval reaches above"
        rows.append(GateRow(f"probe_overhead[{config}]", bound["max"], s.estimate,
                            f"interval not above {bound['max']:g} ({shown})", not s.is_regression,
                            (s.low, s.high), s.p_value))
    if not rows:
        raise ValueError("probe_overhead: the benchmark JSON holds no probe-overhead benchmark "
                         "(pytest --benchmark-only tests/benchmarks/test_probe_overhead.py --benchmark-json FILE)")
    return rows


def _bound_rows(metric: str, value: float, bound: dict[str, float]) -> list[GateRow]:
    rows = []
    if "min" in bound:
        rows.append(GateRow(metric, bound["min"], value, f">= {bound['min']:g}", value >= bound["min"]))
    if "max" in bound:
        rows.append(GateRow(metric, bound["max"], value, f"<= {bound['max']:g}", value <= bound["max"]))
    return rows


def gate_ratios(floors: dict[str, Any], bench: dict[str, Any] | None,
                probe_bench: dict[str, Any] | None) -> GateResult:
    """Every ratio floor whose input is given, checked; a floor its given input cannot measure is an error."""
    rows: list[GateRow] = []
    not_checked: list[str] = []
    errors: list[str] = []
    for metric, bound in floors.get("ratios", {}).items():
        source = RATIO_SOURCES[metric][0]
        given = bench if source == "--bench" else probe_bench
        if given is None:
            not_checked.append(f"{metric} (give {source})")
            continue
        try:
            rows += probe_rows(given, bound) if source == "--probe-bench" else _bound_rows(
                metric, bench_ratio(given, metric), bound)
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        raise ValueError("checks that cannot be made: " + "; ".join(errors))
    return GateResult(rows, not_checked)


def gate_serving(baseline_dir: str | os.PathLike[str], current_dir: str | os.PathLike[str],
                 floors: dict[str, Any]) -> list[GateRow]:
    """Each configured figure of the current run may be worse than the baseline's by the given share.

    A figure either run did not measure is an error: the floors say it must be checked.
    """
    comparison = compare([baseline_dir, current_dir], ["baseline", "current"])
    base, current = comparison.runs
    better = {f.key: f.better for f in FIGURES}
    rows = []
    errors = []
    for metric, allowed in floors.get("serving", {}).items():
        if metric not in better:
            raise ValueError(f"unknown serving figure {metric!r}; known: {', '.join(better)}")
        b, c = base.values[metric], current.values[metric]
        if b is None or c is None:
            which = " and ".join(name for name, v in (("baseline", b), ("current", c)) if v is None)
            errors.append(f"{metric}: not measured in the {which} run"
                          + (" (goodput needs --slo)" if metric.startswith("goodput") else ""))
            continue
        regressed = is_regression(current.deltas[metric], allowed)
        direction = "lower" if better[metric] == "lower" else "higher"
        rows.append(GateRow(metric, b, c, f"{direction} is better; <= {allowed:.0%} worse", not regressed))
    if errors:
        raise ValueError("checks that cannot be made: " + "; ".join(errors)
                         + " (measure them, or give --floors without them)")
    return rows


def run_gate(floors_path: str | None, bench_json: str | None, probe_json: str | None,
             baseline_dir: str | None, current_dir: str | None) -> GateResult:
    if (baseline_dir is None) != (current_dir is None):
        raise ValueError("give --baseline and --current together")
    floors = load_floors(floors_path)
    bench = json.loads(Path(bench_json).read_text()) if bench_json else None
    probes = json.loads(Path(probe_json).read_text()) if probe_json else None
    if bench is None and probes is None and baseline_dir is None:
        raise ValueError("nothing to gate: give --bench, --probe-bench, or --baseline with --current (or --ab)")
    result = gate_ratios(floors, bench, probes)
    rows = list(result.rows)
    not_checked = list(result.not_checked)
    if baseline_dir and current_dir:
        rows += gate_serving(baseline_dir, current_dir, floors)
    elif floors.get("serving"):
        not_checked.append(f"{', '.join(floors['serving'])} (give --baseline and --current)")
    if not rows:
        raise ValueError("no floor applies to the inputs given")
    return GateResult(rows, not_checked)


def format_rows(rows: list[GateRow]) -> str:
    """A plain table for CI logs: metric, baseline, current, threshold, verdict, and interval and p where measured."""
    header = ("metric", "baseline", "current", "threshold", "verdict", "interval", "p")
    body = [(r.metric, _num(r.baseline), _num(r.current), r.threshold, "pass" if r.passed else "FAIL",
             f"{_num(r.interval[0])} .. {_num(r.interval[1])}" if r.interval else "-",
             "-" if r.p_value is None else f"{r.p_value:.2g}") for r in rows]
    widths = [max(len(str(row[i])) for row in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) for row in (header, *body)]
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
