"""The labelled scenario suite: engine settings and loads that induce each bottleneck on purpose.

Each scenario is a few seconds of dummy:tiny under the in-process driver; the diagnosis must
name its label. ``python -m tests.reports.scenarios [DIR]`` runs them all and prints each verdict.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.reports.driver import Load, run

SHORT = {"prompt_tokens": 32, "output_tokens": 32}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    expected: str
    load: Load
    engine: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "continuous"
    why: str = ""


SCENARIOS: tuple[Scenario, ...] = (
    # batching: requests queue behind a batching limit while memory has room
    Scenario("max-num-seqs-1", "batching", Load(users=8, workload_args=SHORT), {"max_num_seqs": 1},
             why="one sequence at a time under 8 users: the cap binds, the pool is nearly empty"),
    Scenario("max-num-seqs-2", "batching", Load(users=16, workload_args=SHORT), {"max_num_seqs": 2},
             why="a cap of 2 under 16 users"),
    Scenario("naive-baseline", "batching", Load(users=6, workload_args=SHORT), kind="naive",
             why="HF one-request-at-a-time server: seats and memory free, nothing admitted"),
    Scenario("static-ragged", "batching",
             Load(users=16, workload="mixed", workload_args={"prompt_range": (16, 64), "output_range": (4, 64)}),
             {"max_num_seqs": 8}, kind="static",
             why="padded static batches with ragged outputs: finished rows hold seats, nobody joins mid-batch"),
    # cache: active request state fills the KV pool
    Scenario("tiny-pool-preempts", "cache", Load(users=16, workload_args={"prompt_tokens": 64, "output_tokens": 64}),
             {"num_kv_blocks": 64, "max_model_len": 256}, why="64 blocks hold ~8 such requests; 16 users preempt"),
    Scenario("contiguous-small-pool", "cache", Load(users=16, workload_args=SHORT),
             {"kv_layout": "contiguous", "num_kv_blocks": 64, "max_model_len": 512},
             why="max-length reservations: 2 requests fill the pool, 90% of it empty"),
    Scenario("long-context-small-pool", "cache",
             Load(users=12, workload_args={"prompt_tokens": 192, "output_tokens": 24}),
             {"num_kv_blocks": 48, "max_model_len": 256}, why="long prompts, 48 blocks: ~3 requests fit"),
    # execution: healthy batch and memory, heavy per-step host work
    Scenario("host-overhead-10ms", "execution", Load(users=8, workload_args=SHORT), {"host_overhead_ms": 10.0},
             why="10 ms of host work per step, several times the forward"),
    Scenario("host-overhead-20ms", "execution", Load(users=16, workload_args=SHORT), {"host_overhead_ms": 20.0},
             why="20 ms per step with a full batch of 16"),
    Scenario("host-overhead-50ms-eager", "execution", Load(users=12, workload_args=SHORT),
             {"host_overhead_ms": 50.0, "execution": "eager"}, why="50 ms per step on the eager path"),
    # none: the offered load is the limit
    Scenario("one-user-thinking", "none", Load(users=1, think_s=0.3, workload_args=SHORT),
             why="one user pausing 0.3 s between requests: the engine idles most of the time"),
    Scenario("open-loop-trickle", "none", Load(rate=2.0, workload_args=SHORT),
             why="2 requests/s, far below capacity"),
    Scenario("two-users-large-pool", "none", Load(users=2, workload_args=SHORT),
             why="2 closed-loop users on a 16-seat engine with a large pool: busy, but nobody waits"),
    Scenario("four-users-thinking", "none", Load(users=4, think_s=0.2, workload_args=SHORT),
             {"host_overhead_ms": 0.0}, why="4 users with think time on a 16-seat engine"),
)


def run_scenario(scenario: Scenario, out: Path) -> Path:
    return run(out, scenario.load, scenario.engine, scenario.kind)


def main(argv: list[str]) -> int:
    from reports.verdict.diagnosis import diagnose

    root = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="scenarios-"))
    wrong = 0
    for scenario in SCENARIOS:
        result = diagnose(run_scenario(scenario, root / scenario.name))
        ok = result.bottleneck == scenario.expected
        wrong += not ok
        print(f"{'ok   ' if ok else 'WRONG'} {scenario.name:28s} expected {scenario.expected:9s} got "
              f"{result.bottleneck:9s} ({result.confidence_label} {result.confidence:.2f}) by {result.deciding}",
              flush=True)
    print(f"run directories under {root}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
