"""Probe overhead on engine throughput: probes on vs off, interleaved in one process on one engine.

Run with ``pytest --benchmark-only tests/benchmarks/test_probe_overhead.py``; a plain ``pytest``
run skips it. Rounds of one workload on one engine cycle through three modes:

- ``off``: no observer attached (the engine skips building its per-step stats);
- ``observer``: a do-nothing observer (what the engine itself spends producing observer data);
- ``probes``: a full ProbeSession (steps, requests, NVML, host) with its flush thread.

Each cycle runs one round of every mode back to back, in an order rotated from cycle to cycle, so a
ratio within a cycle cancels the slow drift of a shared machine's load; overheads are medians of
those per-cycle ratios. Because a shared machine's noise can exceed the 2% target, the probes'
own cost is also accounted directly: the CPU time of the probe threads (sampling, flushing) as a
fraction of the round, and the engine-thread callbacks (``test_probe_callbacks_per_step``).

Rounds last about a second, so each probes round spans the session's periodic flush (1 s) and
host samples (0.5 s). The engine runs one torch thread: on a shared 2-core machine, intra-op
threads spinning against other processes swamp the few percent measured here.
"""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
from pathlib import Path

import psutil
import pytest

from engine import EngineConfig, LLMEngine, RequestEvent, RequestEventKind, SamplingParams, StepStats
from probes.requests import RequestProbe
from probes.run_dir import RunDirectory
from probes.session import ProbeSession
from probes.steps import StepProbe

pytestmark = pytest.mark.benchmark(group="probe-overhead")

MODES = ("off", "observer", "probes")
NUM_CYCLES = 12
NUM_REQUESTS = 16
PROMPT_LEN = 32
MAX_TOKENS = 384
# The engine's default KV pool for dummy:tiny (32768 blocks) and a small one: the engine's per-step
# stats count cached free blocks by walking the whole free queue, so the pool size matters.
POOLS = {"default-kv-pool": None, "512-kv-blocks": 512}
# NOTE: sanity bounds far above the 2% target, so a noisy shared machine does not fail them; the
# measured numbers are the result, reported in extra_info.
SANITY_MAX_PROBE_THREAD_CPU_FRACTION = 0.10
SANITY_MAX_PROBE_OVERHEAD_VS_OBSERVER = 0.50


@pytest.fixture(autouse=True)
def _only_under_benchmark_only(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("benchmark_only", default=False):
        pytest.skip("a benchmark: run it with pytest --benchmark-only")


class _NoopObserver:
    def on_step(self, stats: object) -> None:
        pass

    def on_request_event(self, event: object) -> None:
        pass


def _probe_threads_cpu_s() -> float:
    """CPU seconds used so far by this process's probe threads (named ``probe-*``)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads()
               if names.get(t.id, "").startswith("probe-"))


@pytest.mark.parametrize("pool", list(POOLS))
def test_probe_overhead(benchmark, tmp_path: Path, pool: str) -> None:  # noqa: ANN001 - pytest-benchmark's fixture
    engine = LLMEngine(EngineConfig(model="dummy:tiny", num_kv_blocks=POOLS[pool], num_threads=1))
    rng = random.Random(0)
    # NOTE: one warm-up cycle, then NUM_CYCLES measured ones, each a rotation of MODES.
    schedule = [MODES[(i + c) % len(MODES)] for c in range(NUM_CYCLES + 1) for i in range(len(MODES))]
    modes = iter(schedule)
    round_modes: list[str] = []
    probe_rounds: list[tuple[float, float]] = []  # (probe threads' CPU s, wall s) per probes round
    run_index = itertools.count()

    def setup() -> tuple[tuple[str, object], dict]:
        mode = next(modes)
        # NOTE: fresh random prompts every round, so no round reuses another's cached prefix.
        prompts = [[rng.randrange(256) for _ in range(PROMPT_LEN)] for _ in range(NUM_REQUESTS)]
        for prompt in prompts:
            engine.add_request(prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        attached: object = None
        if mode == "observer":
            attached = _NoopObserver()
            engine.add_observer(attached)  # type: ignore[arg-type]
        elif mode == "probes":
            attached = ProbeSession.for_engine(engine, tmp_path / f"run-{next(run_index)}")
            attached.start()
        return (mode, attached), {}

    def target(mode: str, attached: object) -> None:
        round_modes.append(mode)
        cpu_before, wall_before = _probe_threads_cpu_s(), time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        if mode == "probes":
            probe_rounds.append((_probe_threads_cpu_s() - cpu_before, time.perf_counter() - wall_before))

    def teardown(mode: str, attached: object) -> None:
        if isinstance(attached, ProbeSession):
            attached.stop()
        elif attached is not None:
            engine.remove_observer(attached)  # type: ignore[arg-type]

    benchmark.pedantic(target, setup=setup, teardown=teardown, rounds=NUM_CYCLES * len(MODES),
                       warmup_rounds=len(MODES))
    durations = benchmark.stats.stats.data
    measured = round_modes[-len(durations):]  # NOTE: warm-up rounds ran target too, first
    assert measured == schedule[len(MODES):]
    cycles = [dict(zip(measured[i:i + len(MODES)], durations[i:i + len(MODES)], strict=True))
              for i in range(0, len(durations), len(MODES))]

    def overhead(mode: str, baseline: str) -> float:
        return statistics.median(c[mode] / c[baseline] for c in cycles) - 1

    def overhead_iqr(mode: str, baseline: str) -> list[float]:
        q1, _, q3 = statistics.quantiles([c[mode] / c[baseline] - 1 for c in cycles], n=4)
        return [q1, q3]

    median_s = {m: statistics.median(c[m] for c in cycles) for m in MODES}
    num_tokens = NUM_REQUESTS * MAX_TOKENS
    result = {
        "probe_overhead": overhead("probes", "off"),
        "probe_overhead_vs_observer": overhead("probes", "observer"),
        "engine_observer_overhead": overhead("observer", "off"),
        # NOTE: totals, not a median: thread CPU times tick in 10 ms, about one flush's worth.
        "probe_threads_cpu_fraction": (sum(cpu for cpu, _ in probe_rounds[-NUM_CYCLES:])
                                       / sum(wall for _, wall in probe_rounds[-NUM_CYCLES:])),
        "round_time_spread": (max(durations) - min(durations)) / statistics.median(durations),
    }
    benchmark.extra_info.update({
        "pool": pool, "num_kv_blocks": engine.config.num_kv_blocks, "num_cycles": NUM_CYCLES,
        "probe_overhead_iqr": overhead_iqr("probes", "off"),
        # NOTE: what `servescope gate --probe-bench` decides on: the interval of these paired ratios.
        "probe_overhead_ratios": [c["probes"] / c["off"] for c in cycles],
        "median_round_s": median_s, "tokens_per_s": {m: num_tokens / s for m, s in median_s.items()},
        **result, "meets_2pct_target": result["probe_overhead"] <= 0.02,
    })
    print(f"\n[{pool}] median round " + ", ".join(f"{m} {s * 1e3:.0f} ms" for m, s in median_s.items())
          + "; " + ", ".join(f"{k} {v:+.2%}" for k, v in result.items())
          + " (probes vs off, middle half of cycles: " + " .. ".join(f"{q:+.1%}" for q in overhead_iqr("probes", "off"))
          + ")")
    assert result["probe_threads_cpu_fraction"] <= SANITY_MAX_PROBE_THREAD_CPU_FRACTION
    assert result["probe_overhead_vs_observer"] <= SANITY_MAX_PROBE_OVERHEAD_VS_OBSERVER


def test_probe_callbacks_per_step(benchmark, tmp_path: Path) -> None:  # noqa: ANN001 - pytest-benchmark's fixture
    """What the step and request probes cost the engine's thread in one step of NUM_REQUESTS decodes."""
    run_dir = RunDirectory.create(tmp_path)
    steps, requests = StepProbe(run_dir), RequestProbe(run_dir)
    stats = StepStats(step_index=0, start_time=time.time(), schedule_s=1e-4, prepare_s=1e-4, forward_s=1e-3,
                      sample_s=1e-4, output_s=1e-4, host_overhead_s=0.0, num_seqs=NUM_REQUESTS,
                      num_prefill_tokens=0, num_decode_tokens=NUM_REQUESTS, num_running=NUM_REQUESTS,
                      num_waiting=0, num_kv_blocks_used=64, num_kv_blocks_free=448, num_kv_blocks_cached=0,
                      num_kv_slots_allocated=1024, num_kv_slots_used=1000, num_preemptions=0,
                      num_prefix_hit_tokens=0)
    events = [RequestEvent(f"req-{i}", RequestEventKind.TOKEN, time.time(), PROMPT_LEN, 10)  # type: ignore[arg-type]
              for i in range(NUM_REQUESTS)]
    steps_per_round = 100

    def one_hundred_steps() -> None:
        for _ in range(steps_per_round):
            steps.on_step(stats)
            for event in events:
                requests.on_request_event(event)

    def clear() -> None:
        steps._rows.clear()
        requests._rows.clear()

    benchmark.pedantic(one_hundred_steps, setup=clear, rounds=200, warmup_rounds=5)
    per_step_s = benchmark.stats.stats.median / steps_per_round
    benchmark.extra_info.update({"num_requests": NUM_REQUESTS, "callbacks_per_step_us": per_step_s * 1e6})
    print(f"\nprobe callbacks: {per_step_s * 1e6:.2f} us per step of {NUM_REQUESTS} decodes")
