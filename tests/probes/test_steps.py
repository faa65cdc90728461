"""The step probe against a real engine: token conservation, preemptions, phase times."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import EngineConfig, LLMEngine
from probes.loader import load_table
from probes.run_dir import RunDirectory
from probes.session import ProbeSession
from probes.steps import StepProbe
from tests.probes.workload import drive, random_prompts


def test_prefill_and_decode_tokens_add_up_to_the_requests(engine: LLMEngine, tmp_path: Path) -> None:
    prompts = random_prompts(seed=2, num_prompts=5, length=37)
    session = ProbeSession.for_engine(engine, tmp_path / "run")
    session.start()
    driven = drive(engine, prompts, max_tokens=6, prefix="tokens")
    steps = session.stop().frame("steps")
    assert steps["num_prefix_hit_tokens"].sum() == 0  # fresh random prompts share no cached block
    assert steps["num_prefill_tokens"].sum() == sum(len(p) for p in prompts)
    # NOTE: the step that finishes a prompt samples its first token; every later token is one decode.
    assert steps["num_decode_tokens"].sum() == sum(n - 1 for n in driven.num_output_tokens.values())
    assert (steps["num_seqs"] > 0).all()
    phases = ["schedule_s", "prepare_s", "forward_s", "sample_s", "output_s", "host_overhead_s"]
    assert (steps[phases] >= 0).all().all()
    assert (steps["forward_s"] > 0).all()
    assert steps["total_s"].tolist() == pytest.approx(steps[phases].sum(axis=1).tolist())
    assert (steps["num_kv_slots_used"] <= steps["num_kv_slots_allocated"]).all()


def test_preemptions_show_in_steps_and_requests_and_no_token_time_is_lost(tmp_path: Path) -> None:
    # NOTE: 12 blocks of 16 tokens hold only 3 of these 4-block requests, so the engine must preempt.
    engine = LLMEngine(EngineConfig(model="dummy:tiny", max_model_len=128, num_kv_blocks=12, max_num_seqs=4))
    session = ProbeSession.for_engine(engine, tmp_path / "run")
    session.start()
    driven = drive(engine, random_prompts(seed=3, num_prompts=4, length=24), max_tokens=40, prefix="preempt")
    run = session.stop()
    steps, requests = run.frame("steps"), run.frame("requests")
    assert steps["num_preemptions"].sum() > 0
    assert requests["num_preemptions"].sum() == steps["num_preemptions"].sum()
    for row in requests.to_dict("records"):
        assert len(row["token_times"]) == row["num_output_tokens"] == driven.num_output_tokens[row["request_id"]]
        assert row["ttft_s"] <= row["e2e_s"]


def test_host_overhead_is_recorded_as_its_own_phase(tmp_path: Path) -> None:
    engine = LLMEngine(EngineConfig(model="dummy:tiny", host_overhead_ms=2.0))
    run_dir = RunDirectory.create(tmp_path)
    probe = StepProbe(run_dir)
    probe.start()
    engine.add_observer(probe)
    drive(engine, random_prompts(seed=4, num_prompts=2, length=8), max_tokens=3, prefix="overhead")
    engine.remove_observer(probe)
    probe.stop()
    steps = load_table(run_dir, "steps", may_be_partial=False).to_pandas()
    assert len(steps) == engine.num_steps
    # NOTE: a lower bound only: the engine busy-waits at least host_overhead_ms per step.
    assert (steps["host_overhead_s"] >= 0.002).all()


def test_a_stopped_probe_refuses_to_start_again(tmp_path: Path) -> None:
    probe = StepProbe(RunDirectory.create(tmp_path))
    with pytest.raises(RuntimeError, match="not running"):
        probe.stop()
    probe.start()
    probe.stop()
    with pytest.raises(RuntimeError, match="already started"):
        probe.start()
