"""The request probe on the lifecycles a run can end with: aborted, still in flight, finished early."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from engine import LLMEngine, SamplingParams
from probes.session import ProbeSession
from tests.probes.workload import random_prompts


def test_an_aborted_request_keeps_the_tokens_it_produced(engine: LLMEngine, tmp_path: Path) -> None:
    session = ProbeSession.for_engine(engine, tmp_path / "run")
    session.start()
    (prompt,) = random_prompts(seed=5, num_prompts=1, length=10)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=50, ignore_eos=True), request_id="abort-me")
    for _ in range(3):
        engine.step()
    assert engine.abort(rid)
    row = session.stop().frame("requests").set_index("request_id").loc["abort-me"]
    assert row["is_finished"] and row["finish_reason"] == "abort"
    assert row["num_output_tokens"] == len(row["token_times"]) == 3
    assert row["ttft_s"] <= row["e2e_s"]


def test_a_request_still_in_flight_at_stop_is_written_unfinished(engine: LLMEngine, tmp_path: Path) -> None:
    session = ProbeSession.for_engine(engine, tmp_path / "run")
    session.start()
    (prompt,) = random_prompts(seed=6, num_prompts=1, length=10)
    engine.add_request(prompt, SamplingParams(max_tokens=50, ignore_eos=True), request_id="in-flight")
    engine.step()
    engine.step()
    run = session.stop()
    engine.abort("in-flight")  # leave the shared engine idle; the probe is already detached
    row = run.frame("requests").set_index("request_id").loc["in-flight"]
    assert not row["is_finished"]
    assert pd.isna(row["finish_reason"]) and pd.isna(row["finish_time"]) and pd.isna(row["e2e_s"])
    assert row["num_output_tokens"] == len(row["token_times"]) == 2
    assert row["ttft_s"] > 0


def test_a_request_stopped_by_eos_or_a_stop_string_ends_with_its_reason(engine: LLMEngine, tmp_path: Path) -> None:
    session = ProbeSession.for_engine(engine, tmp_path / "run")
    session.start()
    (prompt,) = random_prompts(seed=7, num_prompts=1, length=10)
    engine.add_request(prompt, SamplingParams(max_tokens=1), request_id="one-token")
    while engine.has_unfinished():
        engine.step()
    row = session.stop().frame("requests").set_index("request_id").loc["one-token"]
    assert row["num_output_tokens"] == len(row["token_times"]) == 1
    assert row["finish_reason"] in {"length", "stop"}
    assert math.isnan(row["tpot_s"]) and len(row["itl_s"]) == 0
    assert row["ttft_s"] <= row["e2e_s"]
