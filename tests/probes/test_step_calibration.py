"""The step calibration: real engines of both execution paths timed at several decode batch sizes."""

from __future__ import annotations

import pytest

from engine import EngineConfig
from probes.execution_variants import ExecutionVariant
from probes.step_calibration import (
    SAMPLING_TEMPERATURE,
    StepCalibration,
    calibration_batches,
    interpolate,
    measure_calibration,
    typical_prompt_step,
)
from tests.reports.driver import shared_model


def test_interpolation_is_piecewise_linear_and_extrapolates_the_last_segment() -> None:
    batches, values = [1, 2, 4, 8], [10.0, 12.0, 14.0, 20.0]
    assert interpolate(batches, values, 1) == 10.0 and interpolate(batches, values, 0.5) == 10.0
    assert interpolate(batches, values, 3) == pytest.approx(13.0)
    assert interpolate(batches, values, 6) == pytest.approx(17.0)
    assert interpolate(batches, values, 16) == pytest.approx(32.0)  # 1.5 per sequence past 8, as from 4 to 8
    assert interpolate([1, 2], [10.0, 9.0], 8) == 9.0  # a falling last segment is not extrapolated below its end
    with pytest.raises(ValueError, match="one value per batch size"):
        interpolate([1, 2], [1.0], 1)


def test_batch_sizes_are_powers_of_two_up_to_what_twice_the_pool_holds() -> None:
    assert calibration_batches(num_kv_blocks=1000, block_size=16, context=100, num_steps=28) == [1, 2, 4, 8, 16]
    # 40 blocks of 16 tokens: 80 blocks hold 10 sequences of 128 + 28 tokens (8 blocks each)
    assert calibration_batches(num_kv_blocks=40, block_size=16, context=100, num_steps=28) == [1, 2, 4, 8]
    assert calibration_batches(num_kv_blocks=2, block_size=16, context=100, num_steps=28) == [1]


def test_both_paths_are_timed_on_the_runs_settings() -> None:
    loaded = shared_model("dummy:tiny")
    config = EngineConfig(model="dummy:tiny", device="cpu", num_threads=1, execution="eager", max_num_seqs=2,
                          host_overhead_ms=5.0, enable_prefix_caching=False).finalize(loaded.config)
    calibration = measure_calibration(loaded, config, context=40, batches=[1, 2, 4], repeats=2,
                                      variants=[ExecutionVariant({"execution": "optimized"})])
    assert calibration.run_path == "eager" and calibration.other_path == "optimized"
    assert list(calibration.step_s) == ["eager", "optimized"]  # the run's own path first
    assert calibration.batches == [1, 2, 4] and calibration.context == 40
    # the run's own path at every size (the seat and pool levers read its curve), a lever's at 1, 4 and the largest
    assert calibration.batches_of("eager") == [1, 2, 4] and calibration.batches_of("optimized") == [1, 4]
    for path in ("eager", "optimized"):
        assert len(calibration.step_s[path]) == len(calibration.forward_s[path]) == len(calibration.batches_of(path))
        assert all(0 < f <= s for f, s in zip(calibration.forward_s[path], calibration.step_s[path], strict=True))
    assert calibration.cost_s > 0
    assert calibration.prefill_tokens == 40 and set(calibration.prefill_forward_s or {}) == {"eager", "optimized"}
    assert calibration.prefill_ratio("optimized") is not None and calibration.prefill_ratio("eager") == 1.0
    again = StepCalibration.from_dict(calibration.to_dict())
    assert again.forward("optimized", 3) == calibration.forward("optimized", 3)
    timing = again.path_timing(3, context=50)
    assert timing.run_path == "eager" and timing.batch == 3 and set(timing.step_s) == {"eager", "optimized"}


def test_the_prompt_chunk_is_the_prompts_that_start_together_cut_to_the_token_budget() -> None:
    # 16 users on 16 seats with 128-token prompts: they start and finish together, a step carries the budget
    assert typical_prompt_step(median_prompt=128, concurrency=16, budget=512) == 512
    # 2 seats (whatever the users queued behind them): two prompts of 133 tokens meet in a step
    assert typical_prompt_step(median_prompt=133, concurrency=2, budget=512) == 266
    assert typical_prompt_step(median_prompt=128, concurrency=1, budget=512) == 128
    assert typical_prompt_step(median_prompt=0.2, concurrency=1, budget=512) == 1
    with pytest.raises(ValueError, match="concurrency and budget"):
        typical_prompt_step(median_prompt=128, concurrency=0, budget=512)


def test_the_calibration_times_the_chunk_it_is_given_within_the_budget_and_samples_as_the_load_does() -> None:
    loaded = shared_model("dummy:tiny")
    config = EngineConfig(model="dummy:tiny", device="cpu", num_threads=1, max_num_seqs=2,
                          max_num_batched_tokens=96).finalize(loaded.config)
    calibration = measure_calibration(loaded, config, context=24, batches=[1, 2], repeats=1, variants=[],
                                      prompt_tokens=80)
    assert calibration.prefill_tokens == 80 and calibration.context == 24
    assert calibration.temperature == SAMPLING_TEMPERATURE
    assert set(calibration.prefill_forward_s or {}) == {calibration.run_path}
    # past the token budget a step would not carry it: the chunk is the budget
    capped = measure_calibration(loaded, config, context=24, batches=[1], repeats=1, variants=[], prompt_tokens=500)
    assert capped.prefill_tokens == 96
