"""Paged-attention decode: one new query token per sequence over its block table.

One program per (sequence, query head) walks the sequence's context in tiles of ``BLOCK_N``
token positions; each position is translated to (block id, offset) through the block table,
so a tile may straddle cache blocks and ``block_size`` need not divide ``BLOCK_N``. Softmax is
the online (running max / running sum) form, all in float32; GQA maps query head ``h`` to KV
head ``h // (H // KVH)``.
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
def _paged_decode_kernel(
    out_ptr,  # [B, H, D]
    q_ptr,  # [B, H, D]
    k_cache_ptr,  # [N, block_size, KVH, D]
    v_cache_ptr,  # [N, block_size, KVH, D]
    block_tables_ptr,  # [B, max_blocks]
    seq_lens_ptr,  # [B]
    scale_log2e,
    block_size,
    stride_qb, stride_qh,
    stride_ob, stride_oh,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_table,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)

    dims = tl.arange(0, HEAD_DIM)  # [D]
    # NOTE: everything is upcast to float32 right after loading: decode is bandwidth-bound, and
    # the interpreter could not do bfloat16 arithmetic anyway.
    q = tl.load(q_ptr + seq * stride_qb + head * stride_qh + dims).to(tl.float32)  # [D]
    q = q * scale_log2e  # softmax in base 2: exp2(x * log2 e) == exp(x)

    m_i = tl.full((), float("-inf"), tl.float32)  # running max
    l_i = tl.full((), 0.0, tl.float32)  # running sum of exp2
    acc = tl.zeros([HEAD_DIM], tl.float32)  # [D]
    table_row = block_tables_ptr + seq * stride_table
    head_offset = kv_head * stride_cache_head
    for start in range(0, seq_len, BLOCK_N):
        positions = start + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        valid = positions < seq_len
        block_ids = tl.load(table_row + positions // block_size, mask=valid, other=0).to(tl.int64)
        slots = block_ids * stride_cache_block + (positions % block_size) * stride_cache_slot + head_offset
        kv_offsets = slots[:, None] + dims[None, :]  # [BLOCK_N, D]
        k = tl.load(k_cache_ptr + kv_offsets, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + kv_offsets, mask=valid[:, None], other=0.0).to(tl.float32)

        scores = tl.sum(k * q[None, :], axis=1)  # [BLOCK_N]
        scores = tl.where(valid, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        # NOTE: the first tile always holds position 0, so m_new is finite from there on and
        # exp2(-inf - m_new) is a clean 0 rather than a NaN.
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new)  # [BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new

    # NOTE: an empty context (seq_len == 0, e.g. a padded CUDA-graph row) yields zeros, not NaN.
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims,
             cast_rounded(out, out_ptr.dtype.element_ty, EMULATE_BF16))


def paged_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           block_n: int = 64) -> torch.Tensor:
    """Attention of one new token per sequence over its first ``seq_lens[b]`` cached tokens.

    ``query`` ``[B, H, D]``; caches ``[N, block_size, KVH, D]`` already hold the new token's key
    and value; ``block_tables`` ``[B, max_blocks]`` and ``seq_lens`` ``[B]`` int32 or int64.
    Values are not checked (that would sync): every ``seq_lens[b] <= max_blocks * block_size``
    and every table entry a valid block id. Returns ``[B, H, D]`` in the query's dtype.
    """
    check_tensor("query", query, 3, FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, 4, FLOAT_DTYPES)
    check_tensor("v_cache", v_cache, 4, FLOAT_DTYPES)
    check_tensor("block_tables", block_tables, 2, INDEX_DTYPES)
    check_tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    require(k_cache.dtype == query.dtype and v_cache.dtype == query.dtype,
            f"query, k_cache and v_cache must share a dtype, got {query.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    check_shape("v_cache", v_cache, tuple(k_cache.shape), "the same as k_cache")
    require(v_cache.stride() == k_cache.stride(), "k_cache and v_cache must have the same strides")
    require(cache_head_dim == head_dim, f"cache head_dim {cache_head_dim} != query head_dim {head_dim}")
    check_head_dim(head_dim)
    require(num_heads % num_kv_heads == 0,
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    require(block_tables.shape[0] == num_seqs, f"block_tables has {block_tables.shape[0]} rows, query {num_seqs}")
    check_shape("seq_lens", seq_lens, (num_seqs,), "one length per sequence")
    for name, tensor in (("query", query), ("k_cache", k_cache), ("block_tables", block_tables)):
        check_unit_last_stride(name, tensor)
    require(seq_lens.is_contiguous(), "seq_lens must be contiguous")
    check_power_of_two("block_n", block_n)
    check_launchable(_paged_decode_kernel, query=query, k_cache=k_cache, v_cache=v_cache,
                     block_tables=block_tables, seq_lens=seq_lens)

    out = torch.empty((num_seqs, num_heads, head_dim), dtype=query.dtype, device=query.device)  # [B, H, D]
    if num_seqs == 0:
        return out
    grid = (num_seqs, num_heads)
    _paged_decode_kernel[grid](
        out, query, k_cache, v_cache, block_tables, seq_lens,
        scale * LOG2E, block_size,
        query.stride(0), query.stride(1),
        out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_N=block_n,
        EMULATE_BF16=emulate_bf16(_paged_decode_kernel, query.dtype),
    )
    return out
