"""Labelled scenarios judged twice from one run: inside (engine probes) and outside (client + /metrics).

Each scenario is one load on one engine config, driven with the engine probes on and the engine's
own ``/metrics`` scraped over HTTP, as ``servescope diagnose`` and ``servescope load --target`` would
see it; both views must name the label. ``python -m tests.reports.agreement [DIR]`` runs them all.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.reports.driver import Load, run
from tests.reports.scenarios import SHORT, Scenario

# Short answers, so that requests finish inside the measured window at a few steps per second.
BIG_MODEL_LOAD = {"prompt_tokens": 32, "output_tokens": 12}

AGREEMENT: tuple[Scenario, ...] = (
    Scenario("seats", "batching", Load(users=8, duration_s=2.0, workload_args=SHORT), {"max_num_seqs": 2},
             why="a cap of 2 seats under 8 users, with a large pool"),
    Scenario("memory", "cache", Load(users=16, duration_s=2.0, workload_args={"prompt_tokens": 64, "output_tokens": 64}),
             {"num_kv_blocks": 64, "max_model_len": 256}, why="64 blocks hold ~8 such requests; 16 users"),
    Scenario("host-overhead", "execution", Load(users=8, duration_s=2.0, workload_args=SHORT),
             {"host_overhead_ms": 10.0}, why="10 ms of host work per step, several times the forward"),
    Scenario("load-limited", "none", Load(users=1, think_s=0.3, duration_s=2.0, workload_args=SHORT),
             why="one user pausing 0.3 s between requests"),
    Scenario("transient-queue", "none", Load(users=8, duration_s=2.0, workload_args=SHORT),
             why="8 closed-loop users on 16 seats: each new request waits one step, nothing binds"),
    Scenario("eager", "execution", Load(users=4, duration_s=8.0, warmup_s=0.5, workload_args=BIG_MODEL_LOAD),
             {"model": "dummy:smollm2-shape", "execution": "eager", "max_model_len": 256},
             why="the eager path on a SmolLM2-shaped model, where the optimized path is ~1.7x faster"),
    Scenario("optimized", "none", Load(users=4, duration_s=8.0, warmup_s=0.5, workload_args=BIG_MODEL_LOAD),
             {"model": "dummy:smollm2-shape", "execution": "optimized", "max_model_len": 256},
             why="the same load on the optimized path: 4 users on 16 seats, nothing binds"),
)


SLOW = frozenset({"eager", "optimized"})  # a SmolLM2-shaped model: tens of seconds; the rest are dummy:tiny


def run_agreement(scenario: Scenario, out: Path) -> Path:
    return run(out, scenario.load, scenario.engine, scenario.kind, metrics=True, time_paths=True)


def main(argv: list[str]) -> int:
    from reports.verdict.diagnosis import diagnose

    root = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="agreement-"))
    wrong = 0
    for scenario in AGREEMENT:
        path = run_agreement(scenario, root / scenario.name)
        inside, outside = diagnose(path, "inside"), diagnose(path, "outside")
        ok = inside.bottleneck == outside.bottleneck == scenario.expected
        wrong += not ok
        print(f"{'ok   ' if ok else 'WRONG'} {scenario.name:16s} expected {scenario.expected:9s} inside "
              f"{inside.bottleneck:9s} by {inside.deciding}; outside {outside.bottleneck:9s} by {outside.deciding}",
              flush=True)
        for view in (inside, outside):
            print("    ", {e.name: (None if e.value is None else round(e.value, 3), e.passed) for e in view.evidence
                          if e.value is not None})
    print(f"run directories under {root}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
