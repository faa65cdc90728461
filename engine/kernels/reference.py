"""Plain-torch references for every kernel, with the kernels' signatures.

The attention and KV-store references call the engine's own eager path (engine/attention.py),
so a kernel that matches them matches what the engine computes without kernels; RMSNorm and
SiLU-mul reuse the model's own torch ops (engine/model/ops.py). ``dense_causal_attention`` is independent of
both the paged layout and SDPA: explicit scores, mask and softmax over a contiguous context,
to check the paged reference itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention import AttentionMetadata, paged_attention
from engine.attention import store_kv as eager_store_kv
from engine.model.ops import rms_norm


def store_kv_reference(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the caches ``[N, block_size, KVH, D]`` with ``key``/``value`` ``[T, KVH, D]`` stored."""
    k_out, v_out = k_cache.clone(), v_cache.clone()
    eager_store_kv(key, value, k_out, v_out, slot_mapping.long())
    return k_out, v_out


def _metadata(block_tables: torch.Tensor, query_lens: list[int], seq_lens: list[int]) -> AttentionMetadata:
    # NOTE: slot_mapping is only read by store_kv, never by paged_attention.
    return AttentionMetadata.build(
        slot_mapping=[0] * sum(query_lens),
        block_tables=block_tables.long().tolist(),
        query_lens=query_lens,
        seq_lens=seq_lens,
    )


def paged_decode_reference(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """``[B, H, D]``: the engine's decode attention, one query per sequence; CPU tensors."""
    meta = _metadata(block_tables, [1] * query.shape[0], seq_lens.tolist())
    return paged_attention(query, k_cache, v_cache, meta, scale)


def paged_prefill_reference(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """``[T, H, D]``: the engine's attention over a flat mixed batch; CPU tensors."""
    starts = query_start_loc.tolist()
    query_lens = [end - start for start, end in zip(starts[:-1], starts[1:], strict=True)]
    meta = _metadata(block_tables, query_lens, seq_lens.tolist())
    return paged_attention(query, k_cache, v_cache, meta, scale)


def dense_causal_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """One sequence: ``query`` ``[Q, H, D]`` are the last Q of the ``S`` positions in ``keys`` and
    ``values`` ``[S, KVH, D]``; query ``j`` sees positions ``<= S - Q + j``. Math in float32 (or
    float64 for float64 inputs), returns ``[Q, H, D]`` in the query's dtype."""
    num_queries, num_heads, _ = query.shape
    num_keys, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    compute = torch.promote_types(query.dtype, torch.float32)
    k = keys.to(compute).repeat_interleave(group, dim=1)  # [S, H, D]
    v = values.to(compute).repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,shd->hqs", query.to(compute), k) * scale  # [H, Q, S]
    q_positions = torch.arange(num_keys - num_queries, num_keys).unsqueeze(1)  # [Q, 1]
    visible = torch.arange(num_keys).unsqueeze(0) <= q_positions  # [Q, S]
    weights = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqs,shd->qhd", weights, v).to(query.dtype)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The model's own plain-torch norm (what ``RMSNorm`` computes without kernels) on ``x`` ``[T, hidden]``."""
    return rms_norm(x, weight, eps)


def fused_add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``, the decoder layer's add-then-norm."""
    summed = x + residual
    return rms_norm_reference(summed, weight, eps), summed


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The model's SwiGLU activation ``silu(gate) * up``."""
    return F.silu(gate) * up


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return silu_mul_reference(gate, up)
