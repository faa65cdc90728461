"""The CPU attention backend of the optimized path: decode rows through the C kernel, the rest in torch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata, paged_attention, store_kv
from engine.cpu_kernels import CpuKernels


@dataclass(frozen=True, slots=True)
class CpuAttentionBackend:
    """KV store as in torch; decode attention read in place from the pages by the C kernel.

    Prompt chunks keep the torch path (SDPA over the gathered context): they are GEMM-shaped and
    torch's kernels do them well; decode rows are where the gathered, padded copies cost the step.
    """

    kernels: CpuKernels
    name: str = "cpu"

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        store_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return paged_attention(query, k_cache, v_cache, meta, scale, decode=self._decode)

    def _decode(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
        assert meta.decode_block_tables is not None and meta.decode_seq_lens is not None
        return self.kernels.paged_decode(query.contiguous(), k_cache, v_cache, meta.decode_block_tables,
                                         meta.decode_seq_lens, scale)
