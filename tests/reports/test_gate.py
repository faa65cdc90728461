"""`servescope gate`: a deliberately slowed engine fails the ratio gate; the normal build passes it."""

from __future__ import annotations

import json
import time

import pytest

from engine import EngineConfig, LLMEngine
from loadtests.bench import run_bench
from reports.gate import bench_ratios, format_rows, gate_ratios, gate_serving, load_floors

ENGINES = ["continuous", "naive", "contiguous"]


def bench(tmp_path, name: str) -> dict:
    config = EngineConfig(model="dummy:tiny", num_kv_blocks=128, max_model_len=512, num_threads=1)
    report = run_bench(config, ENGINES, "fixed", num_prompts=12, concurrency=12, max_tokens=8, seed=0)
    (tmp_path / f"{name}.json").write_text(json.dumps(report))
    return report


@pytest.fixture
def slowed_engine_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test-only: every step of our engine (not the HF baseline) pays 30 ms more, a regressed build."""
    original = LLMEngine.step

    def slow_step(self: LLMEngine):
        time.sleep(0.03)
        return original(self)

    monkeypatch.setattr(LLMEngine, "step", slow_step)


def test_normal_build_passes_the_ratio_gate(tmp_path) -> None:
    rows = gate_ratios(bench_ratios(bench(tmp_path, "normal")), load_floors())
    assert {r.metric for r in rows} == {"continuous_over_naive", "paged_over_contiguous_capacity", "paged_kv_waste"}
    assert all(r.passed for r in rows), format_rows(rows)


def test_slowed_build_fails_the_ratio_gate(tmp_path, slowed_engine_step) -> None:
    rows = gate_ratios(bench_ratios(bench(tmp_path, "slowed")), load_floors())
    failed = {r.metric for r in rows if not r.passed}
    assert "continuous_over_naive" in failed, format_rows(rows)
    table = format_rows(rows)
    assert table.splitlines()[0].split() == ["metric", "baseline", "current", "threshold", "verdict"]
    assert "FAIL" in table


def test_serving_gate_passes_a_run_against_itself_and_names_regressions(scenario_dir) -> None:
    healthy = scenario_dir("two-users-large-pool")
    capped = scenario_dir("max-num-seqs-1")
    floors = load_floors()
    same = gate_serving(healthy, healthy, floors)
    assert same and all(r.passed for r in same)
    worse = gate_serving(healthy, capped, floors)
    assert any(not r.passed for r in worse), format_rows(worse)


def test_gate_cli_exit_codes(tmp_path) -> None:
    from engine.cli import main

    floors = tmp_path / "floors.toml"
    floors.write_text('[ratios]\ncontinuous_over_naive = { min = 1000.0 }\n')
    report = {"engines": {"continuous": {"output_tokens_per_s": 10.0, "peak_concurrent_seqs": 4,
                                         "kv_waste_fraction": 0.02},
                          "naive": {"output_tokens_per_s": 5.0, "peak_concurrent_seqs": 1, "kv_waste_fraction": 0.0}}}
    bench_json = tmp_path / "bench.json"
    bench_json.write_text(json.dumps(report))
    assert main(["gate", "--floors", str(floors), "--bench", str(bench_json)]) == 1
    floors.write_text('[ratios]\ncontinuous_over_naive = { min = 1.5 }\n')
    assert main(["gate", "--floors", str(floors), "--bench", str(bench_json)]) == 0
    assert main(["gate", "--floors", str(floors)]) == 2
