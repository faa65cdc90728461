"""Write this step's keys and values into their slots of the paged KV cache.

Slot ``s`` is offset ``s % block_size`` of block ``s // block_size`` (the block manager's
``block_id * block_size + offset``). One program per token copies all of its KV heads for both
caches, so K and V need a single launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import (
    FLOAT_DTYPES,
    check_head_dim,
    check_launchable,
    check_shape,
    check_tensor,
    check_unit_last_stride,
    require,
)


@triton.jit
def _kv_store_kernel(
    key_ptr,  # [T, KVH, D]
    value_ptr,  # [T, KVH, D]
    k_cache_ptr,  # [N, block_size, KVH, D]
    v_cache_ptr,  # [N, block_size, KVH, D]
    slot_mapping_ptr,  # [T]
    block_size,
    num_kv_heads,
    stride_key_t, stride_key_h,
    stride_value_t, stride_value_h,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    dims = tl.arange(0, HEAD_DIM)  # [D]
    mask = (heads < num_kv_heads)[:, None]  # [BLOCK_H, 1]
    key = tl.load(key_ptr + token * stride_key_t + heads[:, None] * stride_key_h + dims[None, :], mask=mask)
    value = tl.load(value_ptr + token * stride_value_t + heads[:, None] * stride_value_h + dims[None, :],
                    mask=mask)
    cache_offsets = ((slot // block_size) * stride_cache_block + (slot % block_size) * stride_cache_slot
                     + heads[:, None] * stride_cache_head + dims[None, :])  # [BLOCK_H, D]
    tl.store(k_cache_ptr + cache_offsets, key, mask=mask)
    tl.store(v_cache_ptr + cache_offsets, value, mask=mask)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value`` ``[T, KVH, D]`` in place into ``[N, block_size, KVH, D]`` caches.

    ``slot_mapping`` ``[T]`` int64 (or int32) holds one valid slot per token; values are not
    checked (that would sync), and two tokens must not share a slot.
    """
    check_tensor("key", key, 3, FLOAT_DTYPES)
    check_tensor("value", value, 3, FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, 4, FLOAT_DTYPES)
    check_tensor("v_cache", v_cache, 4, FLOAT_DTYPES)
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64, torch.int32))
    num_tokens, num_kv_heads, head_dim = key.shape
    _, block_size, cache_kv_heads, cache_head_dim = k_cache.shape
    check_shape("value", value, tuple(key.shape), "the same as key")
    check_shape("v_cache", v_cache, tuple(k_cache.shape), "the same as k_cache")
    require(v_cache.stride() == k_cache.stride(), "k_cache and v_cache must have the same strides")
    require((cache_kv_heads, cache_head_dim) == (num_kv_heads, head_dim),
            f"cache is [N, block_size, {cache_kv_heads}, {cache_head_dim}] but key is "
            f"[T, {num_kv_heads}, {head_dim}]")
    require(len({key.dtype, value.dtype, k_cache.dtype, v_cache.dtype}) == 1,
            f"key, value and caches must share a dtype (no casts on store), got {key.dtype}, {value.dtype}, "
            f"{k_cache.dtype}, {v_cache.dtype}")
    check_head_dim(head_dim)
    check_shape("slot_mapping", slot_mapping, (num_tokens,), "one slot per token")
    for name, tensor in (("key", key), ("value", value), ("k_cache", k_cache)):
        check_unit_last_stride(name, tensor)
    check_launchable(_kv_store_kernel, key=key, value=value, k_cache=k_cache, v_cache=v_cache,
                     slot_mapping=slot_mapping)
    if num_tokens == 0:
        return
    _kv_store_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        block_size, num_kv_heads,
        key.stride(0), key.stride(1),
        value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(num_kv_heads),
    )
