"""How repeatable the main job is: run ``servescope diagnose`` N times on this machine, print the spread.

Each run is a whole capacity search (README's main job unless other ``diagnose`` flags follow ``--``)
into ``OUT/run-K``. The table gives, per run, when it ran, how long, the load average before it,
the capacity with its interval, the throughput there with its interval, the throughput the curve
saturates at with its interval, and the verdict; then the spread over the runs: the capacities in
search steps apart (over the users any run measured), the throughput at capacity and the saturation
throughput as max/min and as ± around the mean, and whether the verdict agreed. Each
point's throughput in every run follows, so a disagreement can be traced to the points behind it.
``OUT/repeatability.json`` keeps all of it.

    python -m studies.repeatability --runs 3 --out runs/repeat [--lock /tmp/ss-cpu.lock] [-- DIAGNOSE FLAGS]

``--lock FILE`` holds an exclusive lock on FILE during each run (not between runs), for a machine
whose users take turns with such a lock. Not a test: it takes minutes per run.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from probes.run_dir import DIAGNOSIS_NAME
from reports.dataset import DatasetError, RunDataset
from reports.levers.engine_speed import point_load_factor
from reports.whole_table import print_whole


@dataclass(slots=True)
class RunResult:
    """One run of the main job as its ``diagnosis.json`` tells it."""

    run: int
    started_utc: str
    wall_s: float
    load_before: float  # the 1-minute load average as the run started
    returncode: int
    capacity: int | None
    capacity_low: int | None
    capacity_high: int | None
    output_tokens_per_s: float | None
    output_tokens_per_s_low: float | None
    output_tokens_per_s_high: float | None
    saturation: float | None  # the level the curve saturates at (reports.capacity.saturation)
    saturation_low: float | None
    saturation_high: float | None
    verdict: str | None
    verdict_at: str | None  # the point the verdict was read at
    deciding: list[str]  # the evidence that decided it: "name value (comparison threshold)"
    capacity_reason: str
    points: dict[int, float]  # users -> output tok/s of every point the search measured
    point_verdicts: dict[int, str | None]  # users -> each point's own verdict
    other_cpu_cores: dict[int, float | None]  # users -> cores other processes took during the point's window
    engine_load_factor: dict[int, float | None]  # users -> the point's decode forwards over its calibration's


def read_run(run: int, out: Path, started_utc: str, wall_s: float, load_before: float, returncode: int) -> RunResult:
    """What one run's ``diagnosis.json`` says of its capacity and verdict (Nones where it wrote none)."""
    path = out / DIAGNOSIS_NAME
    diagnosis: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    c = diagnosis.get("capacity") or {}
    interval, rate = c.get("interval") or {}, c.get("output_tokens_per_s_interval") or {}
    level = c.get("saturation_tokens_per_s_interval") or {}
    return RunResult(run=run, started_utc=started_utc, wall_s=wall_s, load_before=load_before, returncode=returncode,
                     capacity=c.get("concurrency"), capacity_low=interval.get("low"), capacity_high=interval.get("high"),
                     output_tokens_per_s=c.get("output_tokens_per_s"), output_tokens_per_s_low=rate.get("low"),
                     output_tokens_per_s_high=rate.get("high"), saturation=c.get("saturation_tokens_per_s"),
                     saturation_low=level.get("low"), saturation_high=level.get("high"),
                     verdict=diagnosis.get("bottleneck"),
                     verdict_at=diagnosis.get("label"),
                     deciding=[f"{e['name']} {e['value']:.3g} ({e['comparison']} {e['threshold']:.3g})"
                               for e in diagnosis.get("evidence", []) if e["name"] in diagnosis.get("deciding", [])
                               and e.get("value") is not None and e.get("threshold") is not None],
                     capacity_reason=str(c.get("reason", "")),
                     points={int(p["users"]): p["output_tokens_per_s"] for p in c.get("points", [])
                             if p.get("output_tokens_per_s") is not None},
                     point_verdicts={int(p["concurrency"]): p["bottleneck"]
                                     for p in (diagnosis.get("metrics") or {}).get("points", [])},
                     other_cpu_cores={int(p["users"]): p.get("other_cpu_cores") for p in c.get("points", [])},
                     engine_load_factor={int(p["users"]): point_factor(p, out) for p in c.get("points", [])})


def point_factor(point: dict[str, Any], out: Path) -> float | None:
    """A capacity point's engine load factor: the diagnosis's own, else read from the point's directory."""
    if point.get("engine_load_factor") is not None:
        return float(point["engine_load_factor"])
    return directory_load_factor(out / f"users-{int(point['users'])}")


def directory_load_factor(point_dir: Path) -> float | None:
    """The engine load factor of a point in a run older than the diagnosis's own (``engine_load_factor`` in its
    capacity points), read from its directory; None where the directory cannot say."""
    if not point_dir.is_dir():
        return None
    try:
        return point_load_factor(RunDataset.load(point_dir))
    except DatasetError:
        return None


def spread(results: list[RunResult]) -> dict[str, Any]:
    """How far apart the runs came out: capacity in search steps, throughput at capacity, verdicts."""
    grid = sorted({u for r in results for u in r.points})
    capacities = [r.capacity for r in results if r.capacity is not None]
    steps = [grid.index(c) for c in capacities if c in grid]
    rates = [r.output_tokens_per_s for r in results if r.output_tokens_per_s is not None]
    levels = [r.saturation for r in results if r.saturation is not None]
    verdicts = [r.verdict for r in results]
    return {"num_runs": len(results), "capacities": [r.capacity for r in results],
            "capacity_steps_apart": max(steps) - min(steps) if steps else None,
            "output_tokens_per_s": rates, **_rate_spread("output_tokens_per_s", rates),
            "saturation_tokens_per_s": levels, **_rate_spread("saturation_tokens_per_s", levels),
            "verdicts": verdicts, "same_verdict": len(set(verdicts)) == 1}


def _rate_spread(name: str, rates: list[float]) -> dict[str, float | None]:
    """``rates``' max over min and their largest distance from their mean, as a share of it."""
    mean = statistics.fmean(rates) if rates else None
    return {f"{name}_max_over_min": max(rates) / min(rates) if rates and min(rates) > 0 else None,
            f"{name}_within": max(abs(r - mean) for r in rates) / mean if mean else None}


def _spread_line(s: dict[str, Any]) -> str:
    """The capacity and throughput spread in words; runs that named no capacity are counted, not averaged in."""
    unnamed = sum(c is None for c in s["capacities"])
    level = (f"; saturation throughput max/min {s['saturation_tokens_per_s_max_over_min']:.3f}, within "
             f"±{s['saturation_tokens_per_s_within']:.1%} of the mean" if len(s["saturation_tokens_per_s"]) > 1 else "")
    if unnamed >= s["num_runs"] - 1:
        named = s["num_runs"] - unnamed
        return (f"{named} of {s['num_runs']} runs named a capacity ({s['capacities']} users): nothing to compare "
                f"a spread with{level}")
    line = (f"capacity {s['capacities']} users, {s['capacity_steps_apart']} search steps apart; throughput at "
            f"capacity max/min {s['output_tokens_per_s_max_over_min']:.3f}, within "
            f"±{s['output_tokens_per_s_within']:.1%} of the mean")
    return line + level + (f" ({unnamed} of {s['num_runs']} runs named no capacity and are left out)" if unnamed else "")


@contextlib.contextmanager
def held(lock: Path | None) -> Iterator[None]:
    """An exclusive lock on ``lock`` while the block runs (nothing without one)."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_once(run: int, out: Path, diagnose_args: list[str], lock: Path | None) -> RunResult:
    servescope = shutil.which("servescope") or "servescope"
    with held(lock):
        started_utc = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        load_before = os.getloadavg()[0]
        start = time.monotonic()
        returncode = subprocess.call([servescope, "diagnose", *diagnose_args, "--out", str(out)])
        wall_s = time.monotonic() - start
    return read_run(run, out, started_utc, wall_s, load_before, returncode)


def results_table(results: list[RunResult], s: dict[str, Any], command: str) -> Table:
    table = Table(title=f"{command}: {s['num_runs']} runs")
    for column in ("run", "started", "wall", "load before", "capacity (95%)", "output tok/s at capacity (95%)",
                   "saturates at, tok/s (95%)", "verdict"):
        table.add_column(column, justify="right")
    for r in results:
        capacity = "-" if r.capacity is None else f"{r.capacity} ({r.capacity_low}-{r.capacity_high})"
        rate = _value_range(r.output_tokens_per_s, r.output_tokens_per_s_low, r.output_tokens_per_s_high)
        level = _value_range(r.saturation, r.saturation_low, r.saturation_high)
        table.add_row(str(r.run), r.started_utc, f"{r.wall_s / 60:.1f} min", f"{r.load_before:.2f}", capacity, rate,
                      level, f"{r.verdict} at {r.verdict_at}: {'; '.join(r.deciding) or '-'}")
    return table


def _value_range(value: float | None, low: float | None, high: float | None) -> str:
    """``73.2 (61.6-84.8)``, the value alone without its interval, ``-`` without a value."""
    if value is None:
        return "-"
    return f"{value:.1f}" if low is None or high is None else f"{value:.1f} ({low:.1f}-{high:.1f})"


def points_table(results: list[RunResult]) -> Table:
    grid = sorted({u for r in results for u in r.points})
    table = Table(title="every point by run: output tok/s, the point's own verdict, other processes' cores, the "
                        "engine's decode forwards over its calibration")
    table.add_column("users", justify="right")
    for r in results:
        table.add_column(f"run {r.run}", justify="right")
    for u in grid:
        cells = []
        for r in results:
            other, factor = r.other_cpu_cores.get(u), r.engine_load_factor.get(u)
            cells.append("-" if u not in r.points else
                         f"{r.points[u]:.1f} {r.point_verdicts.get(u)}" + (f" {other:.2f}" if other is not None else "")
                         + (f" {factor:.2f}x" if factor is not None else ""))
        table.add_row(str(u), *cells)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs") / f"repeat-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--lock", type=Path, default=None, help="hold an exclusive lock on this file during each run")
    parser.add_argument("diagnose_args", nargs="*", help="flags for `servescope diagnose` (after --)")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} is not empty; give --out a new directory")
    results = [run_once(k, args.out / f"run-{k}", args.diagnose_args, args.lock) for k in range(1, args.runs + 1)]
    s = spread(results)
    command = " ".join(["servescope diagnose", *args.diagnose_args, "--out DIR"])
    (args.out / "repeatability.json").write_text(json.dumps(
        {"command": command, "runs": [asdict(r) for r in results], "spread": s}, indent=2))
    console = Console()
    print_whole(console, results_table(results, s, command))
    console.print(f"{_spread_line(s)}; verdicts {s['verdicts']}{' (the same)' if s['same_verdict'] else ' (they differ)'}",
                  highlight=False)
    print_whole(console, points_table(results))
    return 0 if all(r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
