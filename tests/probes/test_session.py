"""A short engine run with every probe on writes a complete, consistent run directory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pynvml
import pytest

from engine import LLMEngine, SamplingParams
from probes.base import ProbeState
from probes.loader import load_run
from probes.manifest import RunStatus
from probes.session import ProbeSession
from probes.steps import StepProbe
from tests.probes.conftest import CompleteRun

EXPECTED_FILES = {"run.json", "trace.json", "steps.parquet", "requests.parquet", "nvml.parquet", "host.parquet",
                  "prometheus.parquet"}


def test_every_file_is_written_and_nothing_else_is_left(complete_run: CompleteRun) -> None:
    assert {p.name for p in complete_run.path.iterdir()} == EXPECTED_FILES


def test_one_step_row_per_engine_step(complete_run: CompleteRun) -> None:
    steps = complete_run.run.frame("steps")
    assert complete_run.driven.num_steps > 0
    assert len(steps) == complete_run.driven.num_steps
    indices = steps["step_index"].tolist()
    assert indices == list(range(indices[0], indices[0] + len(indices)))
    assert (steps["start_time"].diff().dropna() > 0).all()


def test_every_request_has_consistent_latencies_and_all_its_token_times(complete_run: CompleteRun) -> None:
    requests = complete_run.run.frame("requests").set_index("request_id")
    driven = complete_run.driven
    assert sorted(requests.index) == sorted(driven.request_ids)
    for rid in driven.request_ids:
        row = requests.loc[rid]
        assert row["is_finished"] and row["finish_reason"] == "length"
        assert row["num_output_tokens"] == driven.num_output_tokens[rid] == len(row["token_times"])
        assert row["num_prompt_tokens"] == driven.num_prompt_tokens[rid]
        assert 0 <= row["queue_time_s"] <= row["ttft_s"] <= row["e2e_s"]
        assert row["arrival_time"] <= row["queued_time"] <= row["first_scheduled_time"]
        assert row["first_token_time"] == row["token_times"][0]
        assert len(row["itl_s"]) == len(row["token_times"]) - 1
        assert (row["itl_s"] >= 0).all()
        assert row["tpot_s"] > 0


def test_nvml_records_its_unavailability_with_nvmls_own_text(complete_run: CompleteRun) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        expected = str(exc)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine; tests/probes/test_nvml.py covers the readings")
    status = complete_run.run.manifest.probes["nvml"]
    assert not status.is_available
    assert status.detail == expected
    assert status.state is ProbeState.STOPPED
    assert complete_run.run.manifest.machine.gpu_unavailable_reason == expected
    assert len(complete_run.run.frame("nvml")) == 0


def test_host_and_prometheus_rows_were_recorded(complete_run: CompleteRun) -> None:
    host = complete_run.run.frame("host")
    assert len(host) >= 2  # one sample at start, one at stop
    assert (host["process_rss_bytes"] > 0).all()
    prometheus = complete_run.run.frame("prometheus")
    gauge = prometheus[prometheus["sample"] == "test_num_requests_running"]
    assert gauge["scrape_index"].nunique() >= 2
    assert set(gauge["value"]) == {3.0}
    assert set(gauge["labels"]) == {json.dumps({"model_name": "dummy:tiny"})}


def test_manifest_describes_the_run(complete_run: CompleteRun) -> None:
    manifest = complete_run.run.manifest
    assert manifest.status is RunStatus.COMPLETE and manifest.error is None
    assert manifest.model == "dummy:tiny"
    assert manifest.engine_config == dataclasses.asdict(complete_run.engine.config)
    assert manifest.workload == {"name": "probe-tests", "num_requests": 6}
    assert manifest.seeds == {"engine": complete_run.engine.config.seed, "workload": 1}
    assert manifest.timers == {"steps": StepProbe.timer}
    assert manifest.software["torch"] is not None and manifest.software["triton"] is not None
    assert manifest.machine.num_cpu_cores_logical and manifest.machine.memory_total_bytes > 0
    assert manifest.started_at <= manifest.stopped_at
    assert {name: p.num_rows for name, p in manifest.probes.items()} == {
        name: len(frame) for name, frame in complete_run.run.frames.items()}
    assert all(p.state is ProbeState.STOPPED for p in manifest.probes.values())


def test_the_trace_loads_as_json_with_the_expected_events(complete_run: CompleteRun) -> None:
    trace = json.loads((complete_run.path / "trace.json").read_text())
    events = trace["traceEvents"]
    steps = [e for e in events if e["ph"] == "X" and e["name"] == "step"]
    assert len(steps) == complete_run.driven.num_steps
    request_begins = [e for e in events if e["ph"] == "b" and e["name"] == "request"]
    assert sorted(e["args"]["request_id"] for e in request_begins) == sorted(complete_run.driven.request_ids)
    assert len([e for e in events if e["ph"] == "e" and e["name"] == "request"]) == len(request_begins)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"batch", "kv cache", "tokens per step", "host cpu"} <= counters
    batch = [e["args"]["num_seqs"] for e in events if e["ph"] == "C" and e["name"] == "batch"]
    assert batch == complete_run.run.frame("steps")["num_seqs"].tolist()


def test_a_session_refuses_a_directory_that_already_holds_a_run(complete_run: CompleteRun) -> None:
    with pytest.raises(FileExistsError, match="already holds a run"):
        ProbeSession.for_engine(complete_run.engine, complete_run.path)


def test_a_session_used_as_a_context_records_the_exception_that_ended_it(engine: LLMEngine, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="load generator died"), \
            ProbeSession.for_engine(engine, tmp_path / "run") as session:
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        raise RuntimeError("load generator died")
    run = load_run(tmp_path / "run")
    assert run.manifest.status is RunStatus.FAILED
    assert run.manifest.error == "RuntimeError: load generator died"
    assert len(run.frame("requests")) == 1 and (tmp_path / "run" / "trace.json").is_file()
    with pytest.raises(RuntimeError, match="already stopped"):
        session.stop()
