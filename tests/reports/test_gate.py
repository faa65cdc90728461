"""`servescope gate` on floors: a deliberately slowed engine fails the ratio gate, the normal build passes it,
and a floor the given inputs cannot measure is an error (exit 2), never a silent skip."""

from __future__ import annotations

import json
import time

import pytest

from engine import EngineConfig, LLMEngine
from loadtests.bench import run_bench
from reports.gate.floors import format_rows, gate_ratios, gate_serving, load_floors

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
    result = gate_ratios(load_floors(), bench(tmp_path, "normal"), None)
    rows = result.rows
    assert {r.metric for r in rows} == {"continuous_over_naive", "paged_over_contiguous_capacity", "paged_kv_waste"}
    assert all(r.passed for r in rows), format_rows(rows)
    assert result.not_checked == ["probe_overhead (give --probe-bench)"]


def test_slowed_build_fails_the_ratio_gate(tmp_path, slowed_engine_step) -> None:
    rows = gate_ratios(load_floors(), bench(tmp_path, "slowed"), None).rows
    failed = {r.metric for r in rows if not r.passed}
    assert "continuous_over_naive" in failed, format_rows(rows)
    table = format_rows(rows)
    assert table.splitlines()[0].split() == ["metric", "baseline", "current", "threshold", "verdict", "interval", "p"]
    assert "FAIL" in table


def test_serving_gate_passes_a_run_against_itself_and_names_regressions(scenario_dir) -> None:
    healthy = scenario_dir("two-users-large-pool")
    capped = scenario_dir("max-num-seqs-1")
    floors = load_floors()
    with pytest.raises(ValueError, match=r"goodput_fraction: not measured in the baseline and current run \(goodput needs --slo\)"):
        gate_serving(healthy, healthy, floors)  # these runs had no SLO: a floor that cannot be checked
    floors["serving"].pop("goodput_fraction")
    same = gate_serving(healthy, healthy, floors)
    assert same and all(r.passed for r in same)
    worse = gate_serving(healthy, capped, floors)
    assert any(not r.passed for r in worse), format_rows(worse)


def _bench_report(engines: tuple[str, ...] = ("continuous", "naive")) -> dict:
    rows = {"continuous": {"output_tokens_per_s": 10.0, "peak_concurrent_seqs": 4, "kv_waste_fraction": 0.02},
            "naive": {"output_tokens_per_s": 5.0, "peak_concurrent_seqs": 1, "kv_waste_fraction": 0.0},
            "contiguous": {"output_tokens_per_s": 8.0, "peak_concurrent_seqs": 2, "kv_waste_fraction": 0.5}}
    return {"engines": {name: rows[name] for name in engines}}


def test_gate_cli_exit_codes(tmp_path, capsys) -> None:
    from loadtests.cli import main

    floors = tmp_path / "floors.toml"
    floors.write_text('[ratios]\ncontinuous_over_naive = { min = 1000.0 }\n')
    bench_json = tmp_path / "bench.json"
    bench_json.write_text(json.dumps(_bench_report()))
    assert main(["gate", "--floors", str(floors), "--bench", str(bench_json)]) == 1
    floors.write_text('[ratios]\ncontinuous_over_naive = { min = 1.5 }\n')
    assert main(["gate", "--floors", str(floors), "--bench", str(bench_json)]) == 0
    assert main(["gate", "--floors", str(floors)]) == 2
    floors.write_text('[ratios]\ncontinous_over_naive = { min = 1.5 }\n')  # a misspelt floor is never checked
    assert main(["gate", "--floors", str(floors), "--bench", str(bench_json)]) == 2
    assert "unknown ratio checks ['continous_over_naive']" in capsys.readouterr().err


def test_a_floor_whose_engine_the_bench_lacks_is_an_error(tmp_path, capsys) -> None:
    from loadtests.cli import main

    with pytest.raises(ValueError, match=r"paged_over_contiguous_capacity: the bench report has no contiguous engine"):
        gate_ratios(load_floors(), _bench_report(), None)
    bench_json = tmp_path / "bench.json"
    bench_json.write_text(json.dumps(_bench_report(("continuous",))))
    assert main(["gate", "--bench", str(bench_json)]) == 2
    err = capsys.readouterr().err
    assert "continuous_over_naive: the bench report has no naive engine" in err
    assert "--engines continuous,naive" in err


def _probe_benchmarks(ratios_by_pool: dict[str, list[float] | None]) -> dict:
    benchmarks = []
    for pool, ratios in ratios_by_pool.items():
        info = {"pool": pool, "probe_overhead": 0.0}
        if ratios is not None:
            info["probe_overhead_ratios"] = ratios
        benchmarks.append({"name": f"test_probe_overhead[{pool}]", "extra_info": info})
    benchmarks.append({"name": "test_probe_callbacks_per_step", "extra_info": {"callbacks_per_step_us": 1.0}})
    return {"benchmarks": benchmarks}


def test_probe_overhead_is_checked_on_every_configuration_by_its_interval() -> None:
    floors = {"ratios": {"probe_overhead": {"max": 0.05}}}
    small = [1.01, 0.99, 1.02, 1.00, 0.98, 1.03, 1.01, 1.00, 0.99, 1.02, 1.01, 1.00]
    large = [1.12, 1.10, 1.14, 1.11, 1.13, 1.09, 1.12, 1.15, 1.10, 1.11, 1.13, 1.12]
    noisy = [1.01, 0.95, 1.40, 0.99, 1.02, 0.97, 1.03, 1.00, 0.90, 1.35, 1.01, 0.98]  # 2 stalls among 12 cycles
    rows = gate_ratios(floors, None, _probe_benchmarks({"default-kv-pool": small, "512-kv-blocks": large,
                                                        "noisy": noisy})).rows
    by_metric = {r.metric: r for r in rows}
    assert set(by_metric) == {"probe_overhead[default-kv-pool]", "probe_overhead[512-kv-blocks]",
                              "probe_overhead[noisy]"}
    assert by_metric["probe_overhead[default-kv-pool]"].passed
    assert by_metric["probe_overhead[noisy]"].passed  # its interval reaches below the ceiling
    large_row = by_metric["probe_overhead[512-kv-blocks]"]
    assert not large_row.passed and large_row.interval[0] > 0.05 and large_row.p_value < 0.025
    table = format_rows(rows)
    assert table.splitlines()[0].split() == ["metric", "baseline", "current", "threshold", "verdict", "interval", "p"]


def test_probe_overhead_without_its_cycles_is_an_error() -> None:
    floors = {"ratios": {"probe_overhead": {"max": 0.05}}}
    with pytest.raises(ValueError, match=r"probe_overhead\[512-kv-blocks\]: the benchmark JSON has no per-cycle ratios"):
        gate_ratios(floors, None, _probe_benchmarks({"default-kv-pool": [1.0] * 12, "512-kv-blocks": None}))
    with pytest.raises(ValueError, match="holds no probe-overhead benchmark"):
        gate_ratios(floors, None, {"benchmarks": []})
