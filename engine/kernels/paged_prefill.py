"""Paged attention for prefill and chunked prefill (any number of new tokens per sequence).

The flat batch holds each sequence's new tokens back to back (``query_start_loc``); sequence
``b``'s new token ``j`` sits at absolute position ``seq_lens[b] - q_len_b + j`` and attends to
every cached position up to its own. All keys, the earlier context and this step's, are read
from the paged cache, so the new K/V must be stored first (``kv_store``). One program per
(query tile, sequence, head) runs a flash-attention loop over key tiles gathered through the
block table, with an online softmax in float32. Sequences with a single new token (decode
rows) are handled too, so a mixed batch needs one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_head_dim,
    check_launchable,
    check_power_of_two,
    check_shape,
    check_tensor,
    check_unit_last_stride,
    require,
)
from engine.kernels._interpreter import cast_rounded, emulate_bf16

LOG2E = 1.4426950408889634


@triton.jit
def _paged_prefill_kernel(
    out_ptr,  # [T, H, D]
    q_ptr,  # [T, H, D]
    k_cache_ptr,  # [N, block_size, KVH, D]
    v_cache_ptr,  # [N, block_size, KVH, D]
    block_tables_ptr,  # [B, max_blocks]
    query_start_loc_ptr,  # [B + 1]
    seq_lens_ptr,  # [B]
    scale_log2e,
    block_size,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_table,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len
    kv_head = head // GROUP

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] index among the new tokens
    row_valid = rows < q_len
    q_positions = context_len + rows  # [BLOCK_M] absolute positions
    dims = tl.arange(0, HEAD_DIM)  # [D]
    q_offsets = (q_start + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :]  # [BLOCK_M, D]
    q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None], other=0.0)
    if EMULATE_BF16:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running row sum of exp2
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    table_row = block_tables_ptr + seq * stride_table
    head_offset = kv_head * stride_cache_head
    # Keys past the tile's last query position are masked for every row: stop the loop there.
    kv_end = tl.minimum(seq_len, context_len + (tile + 1) * BLOCK_M)
    for start in range(0, kv_end, BLOCK_N):
        positions = start + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        valid = positions < kv_end
        block_ids = tl.load(table_row + positions // block_size, mask=valid, other=0).to(tl.int64)
        slots = block_ids * stride_cache_block + (positions % block_size) * stride_cache_slot + head_offset
        kv_offsets = slots[:, None] + dims[None, :]  # [BLOCK_N, D]
        k = tl.load(k_cache_ptr + kv_offsets, mask=valid[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=valid[:, None], other=0.0)
        if EMULATE_BF16:
            k = k.to(tl.float32)
            v = v.to(tl.float32)

        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2e  # [BLOCK_M, BLOCK_N]
        visible = valid[None, :] & (positions[None, :] <= q_positions[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        # NOTE: the first key tile holds position 0, visible to every row, so m_new is finite
        # from the first iteration on and a fully masked later tile adds exact zeros, not NaN.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]
        p = tl.exp2(scores - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # NOTE: p is rounded to the cache dtype for the tensor-core dot, as in flash attention
        # (the trailing .to is a no-op except when emulating bf16 with float32 operands).
        p = cast_rounded(p, v_cache_ptr.dtype.element_ty, EMULATE_BF16).to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new

    out = acc / l_i[:, None]
    out_offsets = (q_start + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :]
    tl.store(out_ptr + out_offsets, cast_rounded(out, out_ptr.dtype.element_ty, EMULATE_BF16),
             mask=row_valid[:, None])


def paged_prefill_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float, max_query_len: int | None = None,
                            block_m: int = 64, block_n: int = 64) -> torch.Tensor:
    """Causal attention of a flat batch of new tokens over their sequences' paged context.

    ``query`` ``[T, H, D]``; caches ``[N, block_size, KVH, D]`` already hold this step's keys and
    values; ``block_tables`` ``[B, max_blocks]``, ``query_start_loc`` ``[B + 1]`` (``[0]`` first,
    ``[B]`` == T) and ``seq_lens`` ``[B]`` (context after this step), int32 or int64.
    ``max_query_len`` sizes the grid; without it ``T`` is used (safe, more idle programs). Values
    are not checked (that would sync). Returns ``[T, H, D]`` in the query's dtype.
    """
    check_tensor("query", query, 3, FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, 4, FLOAT_DTYPES)
    check_tensor("v_cache", v_cache, 4, FLOAT_DTYPES)
    check_tensor("block_tables", block_tables, 2, INDEX_DTYPES)
    check_tensor("query_start_loc", query_start_loc, 1, INDEX_DTYPES)
    check_tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    num_seqs = seq_lens.shape[0]
    require(k_cache.dtype == query.dtype and v_cache.dtype == query.dtype,
            f"query, k_cache and v_cache must share a dtype, got {query.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    check_shape("v_cache", v_cache, tuple(k_cache.shape), "the same as k_cache")
    require(v_cache.stride() == k_cache.stride(), "k_cache and v_cache must have the same strides")
    require(cache_head_dim == head_dim, f"cache head_dim {cache_head_dim} != query head_dim {head_dim}")
    check_head_dim(head_dim)
    require(num_heads % num_kv_heads == 0,
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    require(block_tables.shape[0] == num_seqs,
            f"block_tables has {block_tables.shape[0]} rows, seq_lens {num_seqs}")
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,), "B + 1 offsets")
    for name, tensor in (("query", query), ("k_cache", k_cache), ("block_tables", block_tables)):
        check_unit_last_stride(name, tensor)
    require(seq_lens.is_contiguous() and query_start_loc.is_contiguous(),
            "seq_lens and query_start_loc must be contiguous")
    check_power_of_two("block_m", block_m, minimum=16)  # NOTE: tl.dot needs tiles of at least 16
    check_power_of_two("block_n", block_n, minimum=16)
    if max_query_len is None:
        max_query_len = num_tokens
    require(0 <= max_query_len <= num_tokens, f"max_query_len must be in [0, T={num_tokens}], got {max_query_len}")
    check_launchable(_paged_prefill_kernel, query=query, k_cache=k_cache, v_cache=v_cache,
                     block_tables=block_tables, query_start_loc=query_start_loc, seq_lens=seq_lens)

    out = torch.empty((num_tokens, num_heads, head_dim), dtype=query.dtype, device=query.device)  # [T, H, D]
    if num_tokens == 0 or num_seqs == 0 or max_query_len == 0:
        return out
    grid = (triton.cdiv(max_query_len, block_m), num_seqs, num_heads)
    _paged_prefill_kernel[grid](
        out, query, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
        scale * LOG2E, block_size,
        query.stride(0), query.stride(1),
        out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        EMULATE_BF16=emulate_bf16(_paged_prefill_kernel, query.dtype),
    )
    return out
