"""Report generation from a synthetic 100k-step run (recorded through the real probes)."""

from __future__ import annotations

import random

from engine import RequestEvent, RequestEventKind, StepStats
from engine.request import RequestId
from probes.manifest import RunManifest, RunStatus
from probes.requests import RequestProbe
from probes.run_dir import MANIFEST_NAME, RunDirectory
from probes.steps import StepProbe
from reports import write_report

NUM_STEPS = 100_000
NUM_REQUESTS = 2_000
STEP_S = 0.004


def synthesize_run(path) -> None:
    """Steps of a busy 16-wide decode engine and the lifecycles of its requests, through the probes."""
    run_dir = RunDirectory.create(path)
    steps, requests = StepProbe(run_dir), RequestProbe(run_dir)
    steps.start()
    requests.start()
    rng = random.Random(0)
    t0 = 1_700_000_000.0
    for i in range(NUM_STEPS):
        batch = rng.randint(12, 16)
        used = rng.randint(400, 1000)
        steps.on_step(StepStats(
            step_index=i, start_time=t0 + i * STEP_S, schedule_s=1e-4, prepare_s=2e-4, forward_s=3.3e-3,
            sample_s=2e-4, output_s=1e-4, host_overhead_s=0.0, num_seqs=batch, num_prefill_tokens=0,
            num_decode_tokens=batch, num_running=batch, num_waiting=rng.randint(0, 3), num_kv_blocks_used=used,
            num_kv_blocks_free=1024 - used, num_kv_blocks_cached=10, num_kv_slots_allocated=used * 16,
            num_kv_slots_used=used * 16 - batch * 8, num_preemptions=0, num_prefix_hit_tokens=0))
    per_request = NUM_STEPS * STEP_S / NUM_REQUESTS
    for r in range(NUM_REQUESTS):
        rid = RequestId(f"req-{r}")
        start = t0 + r * per_request
        kinds = [(RequestEventKind.ARRIVED, start, 0), (RequestEventKind.SCHEDULED, start + 0.01, 0)]
        kinds += [(RequestEventKind.TOKEN, start + 0.02 + k * 0.03, k + 1) for k in range(48)]
        kinds += [(RequestEventKind.FINISHED, start + 0.02 + 47 * 0.03, 48)]
        for kind, when, num_out in kinds:
            requests.on_request_event(RequestEvent(rid, kind, when, 128, num_out, 0,
                                                   "length" if kind == RequestEventKind.FINISHED else None))
    steps.stop()
    requests.stop()
    manifest = RunManifest.collect(model="dummy:smollm2-shape", timers={StepProbe.name: StepProbe.timer})
    manifest.status, manifest.stopped_at = RunStatus.COMPLETE, t0 + NUM_STEPS * STEP_S
    manifest.probes = {p.name: p.status for p in (steps, requests)}
    run_dir.write_json(MANIFEST_NAME, manifest.to_dict())


def test_report_from_a_100k_step_run(benchmark, tmp_path) -> None:
    run = tmp_path / "run"
    synthesize_run(run)
    diagnosis = benchmark.pedantic(write_report, args=(run,), rounds=1, iterations=1)
    size = (run / "report.html").stat().st_size
    benchmark.extra_info.update(num_steps=NUM_STEPS, num_requests=NUM_REQUESTS, report_bytes=size)
    assert diagnosis["bottleneck"] in {"batching", "cache", "execution", "none"}
