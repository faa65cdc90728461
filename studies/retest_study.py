"""The retest study: labelled scenarios, each diagnosed, its named lever pulled by ``--retest``, measured.

Each scenario is ``servescope diagnose ... --retest 1`` through the real server and Locust. Run it
alone on the machine (figures for docs/results.md): ``flock /tmp/ss-cpu.lock python -m studies.retest_study
DIR [NAME ...]``; it prints one row per scenario (the lever named, predicted and measured gain, the
prediction's error on output throughput, TTFT and TPOT, the step model's held-out error) and writes
``DIR/study.json``. ``tests/loadtests/test_retest_study.py`` (slow) holds the claims on one scenario.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.run_dir import CALIBRATION_NAME, DIAGNOSIS_NAME, RETEST_NAME

LOAD = ("--duration", "20", "--warmup", "3")


@dataclass(frozen=True, slots=True)
class StudyScenario:
    name: str
    label: str  # what binds, on purpose
    expected_lever: str  # the lever the prediction should name (reports.levers.predictions.Lever.lever)
    argv: tuple[str, ...]
    load: tuple[str, ...] = LOAD  # none: the capacity search's own points, the verdict's point rerun


SCENARIOS = (
    StudyScenario("seat-limited", "batching", "max_num_seqs",
                  ("--model", "smollm2-135m", "--max-num-seqs", "2", "--users", "8", "--workload", "fixed",
                   "--max-tokens", "32")),
    StudyScenario("memory-limited", "cache", "kv_pool",
                  ("--model", "smollm2-135m", "--num-kv-blocks", "40", "--max-model-len", "512", "--users", "8",
                   "--workload", "fixed", "--max-tokens", "96")),
    StudyScenario("host-overhead", "execution", "host_overhead",
                  ("--model", "smollm2-135m", "--host-overhead-ms", "150", "--users", "8", "--workload", "fixed",
                   "--max-tokens", "32")),
    StudyScenario("eager-execution", "execution", "execution",
                  ("--model", "smollm2-135m", "--execution", "eager", "--users", "8", "--workload", "fixed",
                   "--max-tokens", "32")),
    StudyScenario("prefix-caching-off", "cache", "prefix_caching",
                  ("--model", "smollm2-135m", "--no-prefix-caching", "--users", "8", "--workload", "shared-prefix",
                   "--max-tokens", "8")),
    StudyScenario("load-limited", "none", "load",
                  ("--model", "dummy:tiny", "--users", "2", "--workload", "fixed", "--max-tokens", "32")),
    # the engine saturated by its own float32 work, its 16 seats full: a cheaper dtype is what pays
    StudyScenario("dtype", "execution", "dtype=bfloat16",
                  ("--model", "smollm2-135m", "--users", "16", "--workload", "fixed", "--max-tokens", "32")),
    # a bfloat16 engine whose few streams read all its weights every step: fewer weight bytes pay
    StudyScenario("quantized-weights", "execution", "weights=int4",
                  ("--model", "smollm2-135m", "--dtype", "bfloat16", "--max-num-seqs", "2", "--users", "2",
                   "--workload", "fixed", "--max-tokens", "32")),
    # many more users than seats on the default workload (ShareGPT-like prompts, 64 tokens out)
    StudyScenario("seat-limited-many-users", "batching", "max_num_seqs",
                  ("--model", "smollm2-135m", "--max-num-seqs", "2", "--users", "32", "--max-tokens", "64")),
    # the main job as a new user runs it: the capacity search, then its verdict's point with the lever pulled
    StudyScenario("main-job", "execution", "dtype=bfloat16", ("--model", "smollm2-135m"), load=()),
)


def run_scenario(scenario: StudyScenario, root: Path) -> dict[str, Any]:
    """Diagnose, pull the named lever once, and gather the figures of both rounds."""
    out = root / scenario.name
    command = [sys.executable, "-m", "loadtests.cli", "diagnose", *scenario.argv, *scenario.load, "--retest", "1",
               "--out", str(out)]
    log = root / f"{scenario.name}.log"
    with open(log, "w") as f:
        subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False, timeout=1200)
    before = json.loads((out / "round-0" / DIAGNOSIS_NAME).read_text())
    retest = json.loads((out / RETEST_NAME).read_text())
    model = (before.get("predictions") or {}).get("step_model") or {}
    pull = retest["pulls"][0] if retest["pulls"] else None
    calibration_path = out / "round-0" / CALIBRATION_NAME
    calibration = json.loads(calibration_path.read_text()) if calibration_path.is_file() else {}
    named = next((lv for lv in before.get("levers") or [] if lv["lever"] == (before.get("predictions") or {}).get("best")),
                 None)
    return {"scenario": scenario.name, "label": scenario.label, "expected_lever": scenario.expected_lever,
            "command": " ".join(command), "bottleneck": before["bottleneck"],
            "named": (before.get("predictions") or {}).get("best"), "pull": pull,
            "replay_check": (before.get("predictions") or {}).get("replay_check"),
            "step_model": {k: model.get(k) for k in ("holdout_mape", "holdout_total_error", "num_holdout_steps",
                                                     "calibrated")},
            "calibration": {k: calibration.get(k) for k in ("cost_s", "batches", "context", "cached", "load_s")},
            "price": named.get("price") if named else None}


def row(result: dict[str, Any]) -> str:
    pull = result["pull"] or {}
    errors = pull.get("errors") or {}

    def pct(value: float | None) -> str:
        return "–" if value is None else f"{value:+.1%}"

    def x(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}x"

    model = result["step_model"]
    replay = (result.get("replay_check") or {}).get("throughput_error")
    cost = (result.get("calibration") or {}).get("cost_s")
    return (f"| {result['scenario']} | {result['bottleneck']} | {pull.get('flags', '–')} | {x(pull.get('predicted_gain'))} "
            f"| {x(pull.get('measured_gain'))} | {pct(errors.get('output_throughput'))} | {pct(errors.get('ttft_p50'))} "
            f"| {pct(errors.get('tpot_p50'))} | {pct(model.get('holdout_mape'))} / "
            f"{pct(model.get('holdout_total_error'))} | {pct(replay)} | {'–' if cost is None else f'{cost:.1f} s'} "
            f"| {result.get('price') or '–'} |")


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(f"usage: python -m studies.retest_study DIR [SCENARIO ...]\n\n{__doc__}", file=sys.stderr)
        return 2
    root = Path(argv[0])
    names = set(argv[1:])
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for scenario in SCENARIOS:
        if names and scenario.name not in names:
            continue
        result = run_scenario(scenario, root)
        results.append(result)
        print(row(result), flush=True)
    path = root / "study.json"
    previous = json.loads(path.read_text()) if path.is_file() else []
    kept = [r for r in previous if r["scenario"] not in {r["scenario"] for r in results}]
    path.write_text(json.dumps(kept + results, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
