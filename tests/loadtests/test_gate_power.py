"""The A/B gate's power and false-alarm rate on this machine: many full gate runs (``tox -e gate``).

A real 10% engine slowdown (``--host-overhead-ms`` set to a tenth of the round time the latest
unchanged run measured on the gate's clock, over its steps per round: a tenth of a step and its share
of the time between steps) must fail the gate in at least 9 of 10 runs, naming execution (host time); the
unchanged build must pass in at least 19 of 20; a candidate whose scheduler admits fewer sequences
must be named batching. Runs alternate slowed and unchanged so the machine's load hits both alike.

Sizes come from the environment, so the runs can be split into chunks of a few minutes:
``SERVESCOPE_GATE_SLOWED_RUNS`` (default 10), ``SERVESCOPE_GATE_UNCHANGED_RUNS`` (default 20);
``SERVESCOPE_GATE_ROUNDS`` (default 20) rounds per gate run; ``SERVESCOPE_GATE_LOG=FILE`` appends one JSON line per run; ``SERVESCOPE_GATE_CLOCK=cpu`` decides on
the sides' CPU time instead of wall time (each run also logs the other clock's verdict on the same rounds).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path

import pytest

from loadtests.cli import main
from reports.gate.stats import estimate_slowdown

pytestmark = pytest.mark.gate

BASE = "--model dummy:tiny --num-threads 1"
ROUNDS = int(os.environ.get("SERVESCOPE_GATE_ROUNDS", "20"))
CLOCK = os.environ.get("SERVESCOPE_GATE_CLOCK", "wall")
OTHER_CLOCK = {"wall": "cpu", "cpu": "wall"}[CLOCK]


def _gate(out: Path, base: str, candidate: str) -> tuple[int, dict, float]:
    start = time.perf_counter()
    code = main(["gate", "--ab", "--base", base, "--candidate", candidate, "--rounds", str(ROUNDS),
                 "--clock", CLOCK, "--out", str(out)])
    elapsed = time.perf_counter() - start
    assert code in (0, 1), f"gate exited {code}"
    return code, json.loads((out / "ab.json").read_text()), elapsed


def _log(kind: str, candidate: str, code: int, record: dict, elapsed: float) -> dict:
    verdict = record["verdict"]
    # NOTE: the same rounds timed by the other clock, for comparison only; the exit status is CLOCK's.
    other = estimate_slowdown(record[f"{OTHER_CLOCK}_ratios"], verdict["slowdown"]["threshold"])
    row = {"kind": kind, "candidate": candidate, "clock": CLOCK, "exit": code, "wall_s": round(elapsed, 1),
           "slowdown": verdict["slowdown"], "bottleneck": verdict["bottleneck"], "phase": verdict["phase"],
           f"{OTHER_CLOCK}_slowdown": other.to_dict(), f"{OTHER_CLOCK}_exit": int(other.is_regression),
           "base_step_ms": verdict["base"]["step_ms"], "base_round_s": verdict["base"]["round_s"],
           "base_steps_per_round": verdict["base"]["steps_per_round"],
           "base_round_clock_s": statistics.median(record["base"]["round_s" if CLOCK == "wall" else "round_cpu_s"])}
    if os.environ.get("SERVESCOPE_GATE_LOG"):
        with open(os.environ["SERVESCOPE_GATE_LOG"], "a") as log:
            log.write(json.dumps(row) + "\n")
    s = verdict["slowdown"]
    print(f"{kind:9s} exit {code}  {s['estimate']:+.1%} [{s['low']:+.1%} .. {s['high']:+.1%}]  "
          f"bottleneck {verdict['bottleneck']}/{verdict['phase']}  ({OTHER_CLOCK} clock: {other.estimate:+.1%} "
          f"[{other.low:+.1%} .. {other.high:+.1%}])  {elapsed:.0f} s", flush=True)
    return row


def test_a_ten_percent_slowdown_fails_and_the_unchanged_build_passes(tmp_path: Path) -> None:
    num_slowed = int(os.environ.get("SERVESCOPE_GATE_SLOWED_RUNS", "10"))
    num_unchanged = int(os.environ.get("SERVESCOPE_GATE_UNCHANGED_RUNS", "20"))
    code, record, elapsed = _gate(tmp_path / "calibrate", BASE, BASE)
    unchanged = [_log("unchanged", BASE, code, record, elapsed)]
    slowed: list[dict] = []
    run = 0
    while len(slowed) < num_slowed or len(unchanged) < num_unchanged:
        run += 1
        # NOTE: one slowed run per two unchanged ones, interleaved, until both counts are reached. The
        # overhead adds a tenth of a round on the gate's clock, spread over its steps, as the latest
        # unchanged run measured them (the machine's load drifts).
        kind = "slowed" if (run % 3 == 1 and len(slowed) < num_slowed) or len(unchanged) >= num_unchanged \
            else "unchanged"
        overhead_ms = 0.1 * 1e3 * unchanged[-1]["base_round_clock_s"] / unchanged[-1]["base_steps_per_round"]
        flags = f"{BASE} --host-overhead-ms {overhead_ms:.3f}" if kind == "slowed" else BASE
        code, record, elapsed = _gate(tmp_path / f"run-{run}", BASE, flags)
        (slowed if kind == "slowed" else unchanged).append(_log(kind, flags, code, record, elapsed))
    failed = [r for r in slowed if r["exit"] == 1]
    passed = [r for r in unchanged if r["exit"] == 0]
    print(f"slowed by a tenth of the step: {len(failed)} of {len(slowed)} failed; "
          f"unchanged: {len(passed)} of {len(unchanged)} passed")
    assert len(failed) >= math.ceil(0.9 * len(slowed))
    assert len(passed) >= math.ceil(0.95 * len(unchanged))
    assert all((r["bottleneck"], r["phase"]) == ("execution", "host") for r in failed)


def test_fewer_admitted_sequences_is_named_batching(tmp_path: Path) -> None:
    candidate = f"{BASE} --max-num-seqs 4"
    code, record, elapsed = _gate(tmp_path / "seqs", BASE, candidate)
    row = _log("max-seqs", candidate, code, record, elapsed)
    assert code == 1
    assert row["bottleneck"] == "batching"
