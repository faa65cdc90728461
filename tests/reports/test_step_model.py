"""The step-time model: a synthetic step table with known costs gives those costs back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from probes.step_calibration import StepCalibration
from reports.levers.step_model import (
    MIN_WINDOW_STEPS,
    StepWork,
    busy_periods,
    fit_step_model,
    nnls,
)

KNOWN = {"overhead_s": 0.004, "prefill_token_s": 60e-6, "decode_seq_s": 300e-6, "context_token_s": 2e-6}


def synthetic_steps(n: int, noise: float, seed: int = 0, known: dict[str, float] = KNOWN,
                    host_overhead_s: float = 0.0, gap_every: int = 0) -> pd.DataFrame:
    """Back-to-back steps whose period is the known linear cost (times lognormal noise), as the steps probe writes them."""
    rng = np.random.default_rng(seed)
    prefill = rng.choice([0, 0, 0, 32, 128, 300], n)
    decode = rng.integers(1, 33, n)
    context = decode * rng.integers(50, 400, n)
    cost = (known["overhead_s"] + known["prefill_token_s"] * prefill + known["decode_seq_s"] * decode
            + known["context_token_s"] * context) * rng.lognormal(0.0, noise, n)
    total = cost + host_overhead_s
    gaps = np.where((np.arange(n) % gap_every == gap_every - 1) if gap_every else False, 1.0, 0.0)
    start = np.concatenate([[0.0], np.cumsum(total + gaps)[:-1]])
    return pd.DataFrame({"start_time": start, "total_s": total, "forward_s": cost * 0.7,
                         "host_overhead_s": host_overhead_s, "num_prefill_tokens": prefill,
                         "num_decode_tokens": decode, "num_kv_slots_used": context})


def test_known_coefficients_are_recovered() -> None:
    model = fit_step_model(synthetic_steps(2000, noise=0.05))
    assert model is not None
    for name, value in KNOWN.items():
        assert getattr(model.total, name) == pytest.approx(value, rel=0.1), name
    assert abs(model.holdout_total_error) < 0.02
    assert model.holdout_mape < 0.08  # the 5% noise, not a misfit
    assert model.forward.decode_seq_s == pytest.approx(0.7 * KNOWN["decode_seq_s"], rel=0.1)


def test_burnt_host_time_and_idle_gaps_are_left_out_of_the_fit() -> None:
    model = fit_step_model(synthetic_steps(1500, noise=0.02, host_overhead_s=0.02, gap_every=10))
    assert model is not None
    assert model.total.overhead_s == pytest.approx(KNOWN["overhead_s"], rel=0.1)
    assert model.num_fit_steps + model.num_holdout_steps < 1500 * 0.92  # the steps before a 1 s gap dropped


def test_stalled_steps_are_time_not_work() -> None:
    """A step in flight while the process is not run takes the stall's length: fitted as work it lands on that step's
    features. Here 1% of the steps stall 100 ms (on 5-15 ms steps): the coefficients stay the known ones, and the
    run's whole busy time is predicted with the stalls' share, whichever steps were held out."""
    steps = synthetic_steps(2000, noise=0.05, seed=5)
    stalled = np.random.default_rng(6).random(len(steps)) < 0.01
    steps["total_s"] = steps["total_s"] + np.where(stalled, 0.100, 0.0)
    steps["start_time"] = np.concatenate([[0.0], np.cumsum(steps["total_s"])[:-1]])
    for seed in range(4):
        model = fit_step_model(steps, seed=seed)
        assert model is not None
        for name, value in KNOWN.items():
            assert getattr(model.total, name) == pytest.approx(value, rel=0.1, abs=1e-7), (seed, name)
        busy = busy_periods(steps)
        predicted = sum(model.step_time(StepWork(int(p), int(d), int(c))) for p, d, c in
                        zip(busy["num_prefill_tokens"], busy["num_decode_tokens"], busy["num_kv_slots_used"],
                            strict=True))
        assert predicted == pytest.approx(float(busy["period_s"].sum()), rel=0.02), seed
        assert model.stall_share == pytest.approx(0.100 * stalled[:-1].sum() / busy["period_s"].sum(), rel=0.1)
    assert fit_step_model(synthetic_steps(2000, noise=0.05, seed=5)).stall_share < 0.005  # no stalls: none found


def test_the_fit_describes_the_load_window_not_the_drain_after_it() -> None:
    """A queued closed loop's measured steps run on past the load into the drain, where the shared machine ran the
    engine 1.6 times slower: the steps while the load was sending give their own costs back, and a window too
    short to fit on falls back to every step."""
    steps = synthetic_steps(1200, noise=0.05, seed=7)
    drain = np.arange(len(steps)) >= 600
    steps["total_s"] = steps["total_s"] * np.where(drain, 1.6, 1.0)
    steps["start_time"] = np.concatenate([[0.0], np.cumsum(steps["total_s"])[:-1]])
    load_end = float(steps["start_time"][600])
    model = fit_step_model(steps, window=(0.0, load_end))
    assert model is not None
    for name in ("overhead_s", "prefill_token_s", "decode_seq_s"):
        assert getattr(model.total, name) == pytest.approx(KNOWN[name], rel=0.1), name
    assert model.num_fit_steps + model.num_holdout_steps <= 600  # stalls found are not fitted
    short = fit_step_model(steps, window=(0.0, float(steps["start_time"][MIN_WINDOW_STEPS - 1])))
    assert short is not None and short.num_fit_steps + short.num_holdout_steps > 600


def test_a_cost_that_is_absent_stays_zero_never_negative() -> None:
    known = {**KNOWN, "context_token_s": 0.0}
    model = fit_step_model(synthetic_steps(1000, noise=0.2, known=known, seed=3))
    assert model is not None
    assert model.total.context_token_s >= 0.0
    assert model.total.context_token_s < 0.2e-6


def test_nnls_matches_the_unconstrained_fit_when_it_is_non_negative_and_clamps_otherwise() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nnls(a, a @ np.array([2.0, 0.5])) == pytest.approx([2.0, 0.5])
    x = nnls(a, a @ np.array([2.0, -0.5]))  # a falling line: the slope is clamped to 0, the level refitted
    assert x[1] == 0.0 and x[0] == pytest.approx(np.mean(a @ np.array([2.0, -0.5])))
    lower = np.array([-1.5, 0.0])  # a level that may go down to -1.5
    assert nnls(a, a @ np.array([-1.0, 0.5]), lower) == pytest.approx([-1.0, 0.5])
    assert nnls(a, a @ np.array([-2.0, 0.5]), lower)[0] == pytest.approx(-1.5)


def test_a_calibration_that_overstates_the_step_is_corrected_by_a_negative_per_step_term() -> None:
    """Recorded (2026-12-07, the retest test's 2-second eager run of dummy:tiny on a slowed 2-core host): best of
    two calibrated steps at 4 sequences read 4.86 ms where its forward read 2.36, the loaded steps took 3.5-4.0 ms;
    a per-step term held at zero or above predicted every step 1.2 ms too slow, and the replay 28% short of the
    measured throughput. The per-step term may take back the calibrated step's host part, no more."""
    calibrated = calibration()
    over = {path: [1.4 * t for t in times] for path, times in calibrated.step_s.items()}
    overstated = dataclasses.replace(calibrated, step_s=over, temperature=1.0)
    run = loaded_steps(1200, calibrated, "optimized", [2, 4, 8])
    model = fit_step_model(run, calibration=overstated)
    assert model is not None and model.total.overhead_s < 0.0
    host_part_at_two = model.load_factor * 0.4 * calibrated.forward("optimized", 2)
    assert model.total.overhead_s >= -host_part_at_two - 1e-12
    for batch in (2, 8):
        assert model.step_time(StepWork(0, batch, batch * 100)) == pytest.approx(mean_decode_period(run, batch),
                                                                                 rel=0.04), batch


def test_too_few_steps_give_no_model() -> None:
    assert fit_step_model(synthetic_steps(5, noise=0.0)) is None


def calibration(run_path: str = "optimized") -> StepCalibration:
    """A forward that grows slower than linearly with the batch (the weights are read once per step)."""
    forward = {"optimized": [0.040, 0.046, 0.049, 0.052, 0.060], "eager": [0.055, 0.100, 0.079, 0.082, 0.102]}
    return StepCalibration(model="m", dtype="float32", device="cpu", context=100, run_path=run_path,
                           batches=[1, 2, 4, 8, 16], step_s=forward, forward_s=forward, repeats=2, cost_s=1.0,
                           measured_at=0.0, method="synthetic")


def loaded_steps(n: int, calibrated: StepCalibration, path: str, batches: list[int], seed: int = 0,
                 factor: float = 1.3) -> pd.DataFrame:
    """Steps of a loaded server on ``path``: the calibrated forward of the decoding sequences, stretched ``factor``
    times (the rest of the machine's share of the CPU), plus what the load adds (10 ms a step, 1 ms a sequence, 60 us a
    prompt token, 40 of them in the forward), 3% noise."""
    rng = np.random.default_rng(seed)
    prefill = rng.choice([0, 0, 0, 128], n)
    decode = rng.choice(batches, n) * (prefill == 0) + (prefill > 0) * rng.choice([0, 1], n)
    context = decode * 100 + rng.integers(0, 50, n)
    share = calibrated.forward(path, 16) / calibrated.forward(calibrated.run_path, 16)
    path_forward = factor * np.array([calibrated.forward(path, max(d, 1)) for d in decode]) + 40e-6 * prefill * share
    stolen = 0.010 + 0.001 * decode + 20e-6 * prefill
    total = (path_forward + stolen) * rng.lognormal(0.0, 0.03, n)
    start = np.concatenate([[0.0], np.cumsum(total)[:-1]])
    return pd.DataFrame({"start_time": start, "total_s": total, "forward_s": path_forward,
                         "host_overhead_s": 0.0, "num_prefill_tokens": prefill, "num_decode_tokens": decode,
                         "num_kv_slots_used": context})


def mean_decode_period(steps: pd.DataFrame, batch: int) -> float:
    return float(busy_periods(steps).query(f"num_prefill_tokens == 0 and num_decode_tokens == {batch}")["period_s"].mean())


def test_a_calibrated_fit_predicts_a_batch_size_the_run_never_reached() -> None:
    """A run at 1-2 sequences: the calibration, not a line through 1 and 2, gives the step at 8."""
    calibrated = calibration()
    run = loaded_steps(1200, calibrated, "optimized", [1, 2])
    truth = mean_decode_period(loaded_steps(1200, calibrated, "optimized", [8], seed=1), 8)
    model = fit_step_model(run, calibration=calibrated)
    assert model is not None and model.calibration is calibrated
    assert model.load_factor == pytest.approx(1.3, rel=0.01)
    assert model.total.overhead_s == pytest.approx(0.010, rel=0.15)
    assert model.holdout_mape < 0.05
    at_eight = model.step_time(StepWork(0, 8, 800))
    assert at_eight == pytest.approx(truth, rel=0.03)
    line = fit_step_model(run)  # the same run without the calibration: the 1->2 slope carried out to 8
    assert line is not None and abs(line.step_time(StepWork(0, 8, 800)) / truth - 1) > 0.10


def test_the_other_path_saves_its_calibrated_forward_and_keeps_what_the_load_adds() -> None:
    calibrated = calibration(run_path="eager")
    model = fit_step_model(loaded_steps(1500, calibrated, "eager", [2, 4, 8]), calibration=calibrated)
    assert model is not None
    optimized = loaded_steps(1500, calibrated, "optimized", [2, 4, 8], seed=2)
    for batch in (2, 8):
        predicted = model.step_time(StepWork(0, batch, batch * 100), path="optimized")
        assert predicted == pytest.approx(mean_decode_period(optimized, batch), rel=0.04), batch
    # the whole run (prompt rows included) within a few percent
    busy = busy_periods(optimized)
    predicted = sum(model.step_time(StepWork(int(p), int(d), int(c)), path="optimized") for p, d, c in
                    zip(busy["num_prefill_tokens"], busy["num_decode_tokens"], busy["num_kv_slots_used"], strict=True))
    assert predicted == pytest.approx(float(busy["period_s"].sum()), rel=0.04)


def test_a_run_at_constant_batch_predicts_a_faster_way_by_its_load_factor() -> None:
    """Recorded (2026-12-06 09:59 UTC, smollm2-135m float32, 32 users over 2 seats): the calibrated forward at
    2 sequences 35.7 ms, int4's 6.6 ms (between 5.4 at 1 and 9.0 at 4); the loaded server's decode steps at 2
    took 54.0 ms, their forward 49.4 ms (1.38 times the calibrated one); the retest on int4 weights then ran
    12.6 ms steps. Saving the calibrated 29 ms would leave 25 ms; saving it stretched by the load leaves 14."""
    step_s = {"optimized": [0.0393, 0.0386, 0.0406, 0.0595, 0.0741], "int4": [0.0072, 0.0144, 0.0562]}
    forward_s = {"optimized": [0.0375, 0.0357, 0.0355, 0.0474, 0.0538], "int4": [0.0054, 0.0090, 0.0353]}
    calibrated = StepCalibration(model="smollm2-135m", dtype="float32", device="cpu", context=165,
                                 run_path="optimized", batches=[1, 2, 4, 8, 16], step_s=step_s, forward_s=forward_s,
                                 repeats=2, cost_s=9.5, measured_at=0.0, method="recorded", temperature=1.0,
                                 variant_batches={"int4": [1, 4, 16]},
                                 variants={"optimized": {}, "int4": {"dtype": "bfloat16", "weights": "int4"}})
    rng = np.random.default_rng(0)
    n = 400
    noise = rng.lognormal(0.0, 0.02, n)
    forward = 0.0494 * noise
    period = forward + 0.0046
    run = pd.DataFrame({"start_time": np.concatenate([[0.0], np.cumsum(period)[:-1]]), "total_s": period,
                        "forward_s": forward, "host_overhead_s": 0.0, "num_prefill_tokens": 0,
                        "num_decode_tokens": 2, "num_kv_slots_used": 429})
    model = fit_step_model(run, calibration=calibrated)
    assert model is not None and model.load_factor == pytest.approx(49.4 / 35.7, rel=0.02)
    int4 = model.step_time(StepWork(0, 2, 405), path="int4")
    assert int4 == pytest.approx(0.0126, rel=0.15)
