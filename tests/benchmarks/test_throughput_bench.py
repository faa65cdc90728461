"""Offline throughput: our engine vs the naive HF baseline, same weights and workload, one process."""

from __future__ import annotations

from engine import EngineConfig
from loadtests.bench import run_bench


def test_engine_vs_naive_throughput(benchmark) -> None:
    config = EngineConfig(model="dummy:smollm2-shape", max_model_len=512, kv_cache_mb=128)
    report = benchmark.pedantic(run_bench, args=(config, ["continuous", "naive", "static"], "mixed", 16, 16, 32, 0),
                                rounds=1, iterations=1)
    engines = report["engines"]
    for name, row in engines.items():
        benchmark.extra_info[f"{name}_tokens_per_s"] = row["output_tokens_per_s"]
        benchmark.extra_info[f"{name}_kv_waste"] = row["kv_waste_fraction"]
        benchmark.extra_info[f"{name}_mean_batch"] = row["mean_batch_size"]
    benchmark.extra_info["continuous_over_naive"] = engines["continuous"]["ratio_to_naive"]["output_tokens_per_s"]
    assert engines["continuous"]["num_output_tokens"] == engines["naive"]["num_output_tokens"]
