"""A lever's accuracy cost: its logits against the run's own on the run's greedy continuations of fixed prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import EngineConfig, LLMEngine
from probes import calibration_cache
from probes.accuracy import measure_accuracy
from probes.execution_variants import ExecutionVariant
from probes.step_calibration import calibrate, measure_calibration
from tests.reports.driver import shared_model

SETTINGS = {"model": "dummy:tiny", "device": "cpu", "num_threads": 1, "max_num_seqs": 4, "num_kv_blocks": 64,
            "max_model_len": 128}


NUMERIC = (("bf16", {"dtype": "bfloat16"}), ("int8", {"dtype": "bfloat16", "weights": "int8"}),
           ("int4", {"dtype": "bfloat16", "weights": "int4"}))


def test_the_same_numbers_agree_on_every_token_and_each_numeric_lever_shows_its_cost() -> None:
    loaded = shared_model("dummy:tiny")
    engines = {name: LLMEngine(EngineConfig(**SETTINGS, **changes), loaded)
               for name, changes in (("run", {}), ("same", {}), *NUMERIC)}
    others = ["same", *(name for name, _ in NUMERIC)]
    accuracy = measure_accuracy(engines, "run", others, loaded.tokenizer, loaded.config.vocab_size)
    same = accuracy["same"]
    assert same.agreement == 1.0 and same.max_logit_diff == 0.0
    assert same.num_prompts == 4 and same.num_positions == 4 * 8
    for name, _ in NUMERIC:  # a dtype and both weight forms compute other numbers, and say by how much
        cost = accuracy[name]
        assert cost.max_logit_diff > 0.0 and 0.0 <= cost.agreement <= 1.0, name
        assert cost.num_positions == same.num_positions, name
    # fewer bits, farther from the run's numbers: int4 weights on top of bfloat16 differ more than bfloat16 alone
    assert accuracy["int4"].max_logit_diff > accuracy["bf16"].max_logit_diff


def test_the_calibration_prices_only_the_levers_that_change_the_numbers() -> None:
    loaded = shared_model("dummy:tiny")
    config = EngineConfig(**SETTINGS).finalize(loaded.config)
    variants = [ExecutionVariant({"dtype": "bfloat16"}), ExecutionVariant({"attention_backend": "torch"})]
    calibration = measure_calibration(loaded, config, context=24, batches=[1, 2], repeats=1, variants=variants)
    assert set(calibration.forward_s) == {"optimized", "dtype=bfloat16", "attention_backend=torch"}
    assert set(calibration.accuracy or {}) == {"dtype=bfloat16"}
    assert calibration.lever_accuracy("attention_backend=torch") is None
    assert calibration.changes("dtype=bfloat16") == {"dtype": "bfloat16"} and calibration.changes("optimized") == {}


def test_a_second_calibration_of_the_same_machine_model_and_settings_is_read_from_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(calibration_cache.CACHE_ENV, str(tmp_path))
    loaded = shared_model("dummy:tiny")
    config = EngineConfig(**SETTINGS).finalize(loaded.config)
    first = calibrate(loaded, config, context=24)
    second = calibrate(loaded, config, context=24)
    assert not first.cached and second.cached and second.cache_key == first.cache_key
    assert second.forward_s == first.forward_s and second.accuracy == first.accuracy
    assert second.cost_s == first.cost_s  # what measuring it cost, once
    other = calibrate(loaded, EngineConfig(**{**SETTINGS, "num_kv_blocks": 20}).finalize(loaded.config), context=24)
    assert other.cache_key != first.cache_key and not other.cached
    monkeypatch.setenv(calibration_cache.CACHE_ENV, calibration_cache.OFF)
    assert not calibrate(loaded, config, context=24).cached
