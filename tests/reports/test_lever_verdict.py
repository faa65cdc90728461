"""No claim without a computation: the levers' verdict, execution levers with their price, runs with no finished request."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from probes.run_dir import CLIENT_TABLE
from reports.levers.predictions import LeverPrediction, Predictions
from reports.verdict.diagnosis import diagnose
from reports.verdict.evidence import Evidence
from reports.verdict.findings import ENGINE_FINDINGS
from reports.verdict.rules import RULES
from tests.reports.driver import Load, run
from tests.reports.scenarios import SHORT


def lever(name: str, gain: float | None, note: str = "") -> LeverPrediction:
    return LeverPrediction(name, f"--{name} 2", name, gain, note=note)


def test_saturation_is_said_only_when_every_lever_was_predicted_and_the_device_agrees() -> None:
    busy = {"busy_fraction": 0.99, "roof_share": 0.6}
    saturated = Predictions(levers=[lever("a", 1.02), lever("b", 0.9)], **busy).verdict()
    assert "the hardware is saturated" in saturated and "best --a 2, 1.02x" in saturated
    unpredicted = Predictions(levers=[lever("a", 1.02), lever("b", None, "no calibration")], **busy).verdict()
    assert "saturated" not in unpredicted.replace("whether the hardware is saturated is not known", "")
    assert "not predicted: --b 2 (no calibration)" in unpredicted
    nothing = Predictions(levers=[lever("a", None, "no request finished")], **busy).verdict()
    assert nothing.startswith("no lever's gain could be predicted") and "is not known" in nothing
    idle = Predictions(levers=[lever("a", 1.02)], busy_fraction=0.4, roof_share=0.6).verdict()
    assert "saturated" not in idle and "offered load" in idle
    software = Predictions(levers=[lever("a", 1.02)], busy_fraction=0.99, roof_share=0.05).verdict()
    assert "saturated" not in software and "held by software" in software


def test_a_busy_engine_with_its_batch_filled_and_nobody_held_for_a_seat_or_memory_is_execution() -> None:
    def verdict(**passed: bool) -> str | None:
        evidence = {name: Evidence(name, rule.bottleneck, 0.0, rule.threshold, rule.comparison, passed.get(name, False),
                                   "", "") for rule in RULES for name in [rule.name]}
        fired = [f for f in ENGINE_FINDINGS if f.fires(evidence)]
        return fired[0].bottleneck if fired else None

    assert verdict(engine_busy=True, no_seat_or_memory_wait=True, batch_filled=True) == "execution"
    assert verdict(engine_busy=True, no_seat_or_memory_wait=True, batch_filled=False) is None  # room: the load's
    assert verdict(engine_busy=True, no_seat_or_memory_wait=False, batch_filled=True) is None


def test_a_run_whose_window_finished_no_request_counts_them_by_progress_and_still_predicts(
        scenario_dir, tmp_path: Path) -> None:
    """Every measured request cut off in flight when the load stopped (as Locust's stop cancels them): the run is
    judged on its engine steps, the levers predicted from the tokens streamed, and nothing is called saturated."""
    run_dir = tmp_path / "cut-off"
    shutil.copytree(scenario_dir("max-num-seqs-1"), run_dir)
    table = run_dir / f"{CLIENT_TABLE}.parquet"
    rows = pd.read_parquet(table)
    measured = ~rows["is_warmup"].astype(bool)
    rows.loc[measured, "is_ok"] = False
    rows.loc[measured, "error"] = "cancelled: GreenletExit"
    for column in ("end_time", "ttft_s", "tpot_s", "e2e_s", "num_output_tokens"):
        rows.loc[measured, column] = None
    rows.to_parquet(table)
    result = diagnose(run_dir)
    assert result.has_verdict and "count by their progress" in result.summary
    assert result.predictions["unknown"] is None
    gains = {lv["lever"]: lv["predicted_gain"] for lv in result.levers}
    assert gains["max_num_seqs"] is not None and gains["max_num_seqs"] > 1.1
    assert result.predictions["replay_check"]["measured"]["by_progress"]
    assert "the hardware is saturated" not in result.predictions["verdict"]


def test_execution_levers_are_predicted_and_priced_and_a_lever_changing_no_number_shows_no_price(
        tmp_path: Path) -> None:
    import torch

    from probes.execution_variants import c_kernels_isa, native_dtypes

    run_dir = run(tmp_path / "levers", Load(users=8, duration_s=2.0, workload_args=SHORT), {"max_num_seqs": 8},
                  time_paths=True, execution_levers=True)
    result = diagnose(run_dir)
    by_name = {lv["lever"]: lv for lv in result.levers}
    for name, lv in by_name.items():
        if not lv["changes_numbers"]:
            assert lv["accuracy"] is None and lv["price"].startswith("none"), name
    assert by_name["attention_backend=torch"]["predicted_gain"] is not None
    assert set(result.predictions["calibration"]["variants"]) >= {"optimized", "attention_backend=torch"}
    if "bfloat16" not in native_dtypes(torch.device("cpu")):
        # oneDNN would emulate bfloat16 here: neither it nor int8 is offered; int4 on the C kernel, with float32
        # activations, where the kernels build
        numeric = sorted(name for name, lv in by_name.items() if lv["changes_numbers"])
        if c_kernels_isa() is None:
            assert numeric == [], numeric
            pytest.skip("no native bfloat16 GEMM and no C kernels here: no lever changes the numbers")
        # the AVX2 kernels are offered 8-bit activations too
        assert numeric == ["int4_act_bits=8,weights=int4"] * (c_kernels_isa() == "avx2") + ["weights=int4"], numeric
        int4 = by_name["weights=int4"]
        assert int4["flags"] == "--weights int4" and int4["predicted_gain"] is not None
        assert 0.0 <= int4["accuracy"]["agreement"] <= 1.0 and int4["price"].startswith("agrees on ")
        assert "weights=int4" in result.predictions["calibration"]["variants"]
        return
    bf16 = by_name["dtype=bfloat16"]
    assert bf16["flags"] == "--dtype bfloat16" and bf16["predicted_gain"] is not None
    assert bf16["changes_numbers"] and 0.0 <= bf16["accuracy"]["agreement"] <= 1.0
    assert bf16["accuracy"]["max_logit_diff"] > 0 and bf16["price"].startswith("agrees on ")
    assert "dtype=bfloat16" in result.predictions["calibration"]["variants"]


@pytest.mark.parametrize("gain", [1.5])
def test_the_best_lever_states_its_gain_and_price(gain: float) -> None:
    best = LeverPrediction("dtype=bfloat16", "--dtype bfloat16", "bfloat16", gain, {"output_throughput": 150.0},
                           changes_numbers=True, accuracy={"agreement": 0.97, "max_logit_diff": 0.4,
                                                           "num_positions": 72, "num_prompts": 6, "method": ""})
    predictions = Predictions(levers=[best, lever("a", 1.0)],
                              replay_check={"measured": {"output_throughput": 100.0}})
    text = predictions.best_lever()["text"]
    assert "--dtype bfloat16" in text and "1.50x" in text and "100.0 -> 150.0" in text and "agrees on 97%" in text
