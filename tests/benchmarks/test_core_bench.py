"""Engine-core micro-benchmarks: block manager, scheduler, attention paths, one engine step."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.attention import AttentionMetadata, paged_attention
from engine.block_manager import BlockManager
from engine.model.config import LlamaConfig
from engine.request import Request, RequestId
from engine.sampling_params import SamplingParams as Params
from engine.scheduler import Scheduler
from engine.weights import load_model
from probes.model_shape import ModelShape
from probes.peaks import measure_peaks

TINY = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, max_position_embeddings=4096)


def test_block_manager_allocate_free_and_prefix_lookup(benchmark) -> None:
    bm = BlockManager(num_blocks=4096, block_size=16, enable_prefix_caching=True)
    prompts = [[7] * 256 + list(range(i, i + 64)) for i in range(64)]

    def cycle() -> int:
        hits = 0
        requests = [Request(RequestId(f"r{i}"), p, Params(), 4096) for i, p in enumerate(prompts)]
        for r in requests:
            prefix = bm.find_cached_prefix(r)
            hits += len(prefix)
            assert bm.allocate_slots(r, r.num_tokens - len(prefix) * 16, prefix)
            r.num_computed_tokens = r.num_tokens
            bm.cache_full_blocks(r)
        for r in requests:
            bm.free(r)
        return hits

    hits = benchmark(cycle)
    benchmark.extra_info["prefix_hit_blocks_per_cycle"] = hits
    assert bm.num_free_blocks == bm.num_blocks


def test_scheduler_step_with_256_running(benchmark) -> None:
    config = EngineConfig(model="dummy:tiny", max_num_seqs=256, max_num_batched_tokens=512, num_kv_blocks=8192,
                          max_model_len=2048).finalize(TINY)
    scheduler = Scheduler(config)
    for i in range(256):
        scheduler.add_request(Request(RequestId(f"r{i}"), [1 + i % 50] * 32, Params(max_tokens=10**6,
                                                                                  ignore_eos=True), 2048))
    while scheduler.num_waiting:  # admit and prefill everyone first
        out = scheduler.schedule()
        scheduler.update(out, {s.request.request_id: 3 for s in out.scheduled if s.samples_token})

    def step() -> int:
        out = scheduler.schedule()
        scheduler.update(out, {s.request.request_id: 3 for s in out.scheduled if s.samples_token})
        return len(out.scheduled)

    # NOTE: a bounded number of rounds, so the growing requests never outrun the pool (no preemption).
    assert benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=10) == 256
    assert scheduler.num_preemptions_total == 0
    benchmark.extra_info["batch_size"] = 256


def _decode_meta(batch: int, context: int, block_size: int = 16):
    blocks_per_seq = context // block_size
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]
    slots = [t[-1] * block_size + block_size - 1 for t in tables]
    return AttentionMetadata.build(slots, tables, [1] * batch, [context] * batch), batch * blocks_per_seq


def test_paged_decode_attention_vs_dense(benchmark) -> None:
    batch, context, heads, kv_heads, dim = 32, 512, 9, 3, 64
    meta, num_blocks = _decode_meta(batch, context)
    k_cache = torch.randn(num_blocks, 16, kv_heads, dim)
    v_cache = torch.randn(num_blocks, 16, kv_heads, dim)
    query = torch.randn(batch, heads, dim)
    out = benchmark(paged_attention, query, k_cache, v_cache, meta, dim**-0.5)
    # the dense equivalent, for the record: contiguous K/V of the same size
    keys = k_cache.view(batch, context, kv_heads, dim).transpose(1, 2)
    values = v_cache.view(batch, context, kv_heads, dim).transpose(1, 2)
    dense = torch.nn.functional.scaled_dot_product_attention(query.unsqueeze(2), keys, values, enable_gqa=True,
                                                             scale=dim**-0.5).squeeze(2)
    torch.testing.assert_close(out, dense, rtol=1e-4, atol=1e-4)
    benchmark.extra_info["kv_bytes_read"] = 2 * k_cache.numel() * k_cache.element_size()


@pytest.fixture(scope="module")
def step_device() -> tuple[str, str]:
    """The device the engine picks ("auto") and the dtype it is benchmarked in there."""
    return ("cuda", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")


@pytest.fixture(scope="module")
def step_peaks(step_device):
    return measure_peaks(*step_device)


@pytest.mark.parametrize("execution", ["eager", "optimized"])
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_engine_decode_step(benchmark, step_device, step_peaks, batch: int, execution: str) -> None:
    """One decode step of ``batch`` sequences with 128-token contexts, and its memory-bandwidth use (MBU).

    On a GPU, ``optimized`` replays CUDA graphs with the Triton kernels and ``eager`` runs plain torch
    ops, so the pair is the CUDA-graph-vs-eager figure; on CPU it is the prepacked, buffer-reusing path
    against plain torch.
    """
    device, dtype = step_device
    loaded = load_model("dummy:smollm2-shape", getattr(torch, dtype))
    config = EngineConfig(model="dummy:smollm2-shape", dtype=dtype, execution=execution, max_num_seqs=batch,
                          max_model_len=1024)
    engine = LLMEngine(config, loaded)
    for i in range(batch):
        engine.add_request([100 + i] * 128, SamplingParams(max_tokens=10**6, ignore_eos=True))
    while engine.scheduler.num_waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
        engine.step()
    # NOTE: every step ends by copying the logits to the host, so its wall time covers the device work.
    benchmark.pedantic(engine.step, rounds=10, iterations=1, warmup_rounds=2)
    mean_s = benchmark.stats.stats.mean
    shape = ModelShape.from_config("dummy:smollm2-shape", loaded.config, dtype)
    weight_bytes = shape.weight_bytes
    kv_bytes = sum(r.num_computed_tokens for r in engine.scheduler.running) * shape.kv_bytes_per_token
    bytes_per_s = (weight_bytes + kv_bytes) / mean_s
    benchmark.extra_info.update(
        device=step_peaks.device, dtype=dtype, execution=execution, batch_size=batch,
        cuda_graphs=engine.runner.decode_graphs is not None, tokens_per_s=batch / mean_s,
        bytes_per_step=weight_bytes + kv_bytes, gb_per_s=bytes_per_s / 1e9,
        peak_gb_per_s=step_peaks.bandwidth_bytes_per_s / 1e9, mbu=bytes_per_s / step_peaks.bandwidth_bytes_per_s,
    )
