"""The Triton attention backend: the runner plugs it into every layer on the optimized GPU path."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata
from engine.kernels.kv_store import store_kv
from engine.kernels.paged_decode import paged_decode_attention
from engine.kernels.paged_prefill import paged_prefill_attention


@dataclass(frozen=True, slots=True)
class TritonAttentionBackend:
    """KV store and paged attention through the Triton kernels.

    A pure-decode batch (one new token per sequence, the CUDA-graph case) uses the decode
    kernel; anything with a prompt chunk goes through the prefill kernel in one launch.
    """

    name: str = "triton"

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        store_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        assert meta.seq_lens_t is not None and meta.query_start_loc_t is not None
        if not meta.prefill_ids:
            return paged_decode_attention(query, k_cache, v_cache, meta.block_tables, meta.seq_lens_t, scale)
        return paged_prefill_attention(query, k_cache, v_cache, meta.block_tables, meta.query_start_loc_t,
                                       meta.seq_lens_t, scale, meta.max_query_len)
