"""CUDA-graph capture of pure-decode steps, one graph per padded batch-size bucket (GPU only).

A decode step of B sequences launches hundreds of small kernels; replaying a captured graph
removes the per-kernel launch cost on the host. Each bucket's graph reads static input buffers,
so a step copies its inputs in, pads the rest, replays, and reads the first B rows back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata
from engine.model.llama import KVCache, LlamaForCausalLM


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 8 up to ``max_num_seqs`` (the sizes vLLM-style runners use)."""
    buckets = [b for b in (1, 2, 4) if b < max_num_seqs]
    buckets += list(range(8, max_num_seqs, 8))
    return sorted({*buckets, max_num_seqs})


@dataclass(slots=True)
class _StaticInputs:
    input_ids: torch.Tensor  # [Bmax]
    positions: torch.Tensor  # [Bmax]
    slot_mapping: torch.Tensor  # [Bmax]
    block_tables: torch.Tensor  # [Bmax, max_blocks]
    seq_lens: torch.Tensor  # [Bmax] int32
    query_start_loc: torch.Tensor  # [Bmax + 1] int32


class DecodeGraphs:
    """Captured decode graphs over the model, its KV cache and the Triton attention backend.

    NOTE: padded rows write their K/V to ``scratch_slot`` (a slot no request owns) and have
    context length 0, so they neither corrupt the cache nor produce NaNs.
    """

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache], max_num_seqs: int,
                 max_blocks_per_seq: int, scratch_slot: int, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.model = model
        self.kv_caches = kv_caches
        self.buckets = batch_buckets(max_num_seqs)
        self.scratch_slot = scratch_slot
        b = self.buckets[-1]
        i64 = {"dtype": torch.int64, "device": device}
        i32 = {"dtype": torch.int32, "device": device}
        self.inputs = _StaticInputs(
            input_ids=torch.zeros(b, **i64), positions=torch.zeros(b, **i64),
            slot_mapping=torch.full((b,), scratch_slot, **i64),
            block_tables=torch.zeros((b, max_blocks_per_seq), **i64), seq_lens=torch.zeros(b, **i32),
            query_start_loc=torch.arange(b + 1, **i32),
        )
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def _meta(self, batch: int) -> AttentionMetadata:
        x = self.inputs
        return AttentionMetadata(
            slot_mapping=x.slot_mapping[:batch], block_tables=x.block_tables[:batch],
            query_start_loc=list(range(batch + 1)), seq_lens=[1] * batch, decode_ids=list(range(batch)),
            prefill_ids=[], seq_lens_t=x.seq_lens[:batch], query_start_loc_t=x.query_start_loc[:batch + 1],
            max_query_len=1,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first so the smaller graphs share its memory pool."""
        for batch in reversed(self.buckets):
            meta = self._meta(batch)
            args = (self.inputs.input_ids[:batch], self.inputs.positions[:batch], self.kv_caches, meta)
            self.model(*args)  # warm-up: Triton compiles outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[batch] = self.model(*args)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[batch] = graph
        torch.cuda.synchronize()

    def can_run(self, num_seqs: int) -> bool:
        return bool(self.graphs) and num_seqs <= self.buckets[-1]

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Replay the smallest bucket that fits; returns hidden states ``[B, hidden]``."""
        batch = input_ids.shape[0]
        bucket = next(b for b in self.buckets if b >= batch)
        x = self.inputs
        assert meta.seq_lens_t is not None
        x.input_ids[:batch].copy_(input_ids)
        x.positions[:batch].copy_(positions)
        x.slot_mapping[:batch].copy_(meta.slot_mapping)
        x.slot_mapping[batch:bucket].fill_(self.scratch_slot)
        x.block_tables[:batch, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        x.seq_lens[:batch].copy_(meta.seq_lens_t)
        x.seq_lens[batch:bucket].zero_()
        self.graphs[bucket].replay()
        return self.outputs[bucket][:batch]
