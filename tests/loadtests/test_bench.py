"""`servescope bench` on the dummy model: every engine, one workload, comparable results."""

from __future__ import annotations

import json

from engine import EngineConfig
from loadtests.bench import ENGINES, run_bench


def test_bench_runs_every_engine_on_the_same_work(tmp_path) -> None:
    config = EngineConfig(model="dummy:tiny", kv_cache_mb=2.0, max_model_len=512)
    report = run_bench(config, list(ENGINES), "mixed", num_prompts=10, concurrency=4, max_tokens=12, seed=0,
                       warmup=False)
    engines = report["engines"]
    assert set(engines) == set(ENGINES)
    assert len({row["num_output_tokens"] for row in engines.values()}) == 1  # same work everywhere
    assert engines["naive"]["ratio_to_naive"]["output_tokens_per_s"] == 1.0
    # Every engine gets a ratio to each baseline, HF's own continuous batching included.
    for baseline in ("naive", "static", "hf_cb"):
        assert all(row[f"ratio_to_{baseline}"]["output_tokens_per_s"] > 0 for row in engines.values())
    assert engines["hf-cb"]["ratio_to_hf_cb"]["output_tokens_per_s"] == 1.0
    assert engines["hf-cb"]["peak_concurrent_seqs"] == 4
    assert engines["naive"]["peak_concurrent_seqs"] == engines["no-batching"]["peak_concurrent_seqs"] == 1
    assert engines["continuous"]["peak_concurrent_seqs"] == 4
    # Reserving max_model_len per request wastes most of what it allocates; paging wastes a block tail.
    assert engines["contiguous"]["kv_waste_fraction"] > 0.5 > engines["continuous"]["kv_waste_fraction"]
    json.dumps(report)  # the report is plain JSON


def test_contiguous_layout_fits_fewer_sequences_in_the_same_memory() -> None:
    # 128 blocks of 16 = 2048 slots; contiguous reserves max_model_len=512 per request, so 4 fit,
    # while paged requests of 128 + 8 tokens take 9 blocks each, so all 12 fit at once.
    config = EngineConfig(model="dummy:tiny", num_kv_blocks=128, max_model_len=512)
    report = run_bench(config, ["continuous", "contiguous"], "fixed", num_prompts=12, concurrency=12,
                       max_tokens=8, seed=0, warmup=False)
    assert report["engines"]["contiguous"]["peak_concurrent_seqs"] == 4
    assert report["engines"]["continuous"]["peak_concurrent_seqs"] == 12
