"""kv_store.store_kv against the engine's eager store_kv."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import store_kv
from engine.kernels.reference import store_kv_reference
from tests.engine.kernels.paged_cases import random_tensor

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(2, 16, 4), (3, 32, 16)])
def test_matches_reference(device: torch.device, dtype: torch.dtype, slot_dtype: torch.dtype,
                           num_kv_heads: int, head_dim: int, block_size: int) -> None:
    num_tokens, num_blocks = 11, 6
    generator = torch.Generator().manual_seed(0)
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens].to(slot_dtype)
    # Keys and values as views into a fused qkv projection, as the model produces them.
    qkv = random_tensor((num_tokens, 4 + 2 * num_kv_heads, head_dim), dtype, device, 1)
    key, value = qkv[:, 4 : 4 + num_kv_heads], qkv[:, 4 + num_kv_heads :]  # [T, KVH, D]
    k_cache = random_tensor((num_blocks, block_size, num_kv_heads, head_dim), dtype, device, 2)
    v_cache = random_tensor((num_blocks, block_size, num_kv_heads, head_dim), dtype, device, 3)
    expected_k, expected_v = store_kv_reference(key.cpu(), value.cpu(), k_cache.cpu(), v_cache.cpu(), slots)
    store_kv(key, value, k_cache, v_cache, slots.to(device))
    # A copy must be bit-exact, and every slot not written must keep its old contents.
    assert torch.equal(k_cache.cpu(), expected_k)
    assert torch.equal(v_cache.cpu(), expected_v)


def test_no_tokens_is_a_no_op(device: torch.device) -> None:
    k_cache = torch.zeros(2, 4, 2, 16, device=device)
    v_cache = torch.zeros(2, 4, 2, 16, device=device)
    empty = torch.zeros(0, 2, 16, device=device)
    store_kv(empty, empty, k_cache, v_cache, torch.zeros(0, dtype=torch.int64, device=device))
    assert not k_cache.any() and not v_cache.any()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"key": torch.zeros(3, 2, 16, dtype=torch.float16)}, "must share a dtype"),
    ({"value": torch.zeros(3, 2, 8)}, "value must have shape"),
    ({"key": torch.zeros(3, 1, 16), "value": torch.zeros(3, 1, 16)}, "cache is"),
    ({"slot_mapping": torch.zeros(4, dtype=torch.int64)}, "slot_mapping must have shape"),
    ({"slot_mapping": torch.zeros(3)}, "slot_mapping must be one of"),
    ({"v_cache": torch.zeros(2, 4, 2, 16).transpose(0, 1).contiguous().transpose(0, 1)}, "same strides"),
])
def test_bad_inputs_raise(device: torch.device, overrides: dict[str, torch.Tensor], message: str) -> None:
    args = {
        "key": torch.zeros(3, 2, 16),
        "value": torch.zeros(3, 2, 16),
        "k_cache": torch.zeros(2, 4, 2, 16),
        "v_cache": torch.zeros(2, 4, 2, 16),
        "slot_mapping": torch.tensor([0, 5, 2]),
    }
    args.update(overrides)
    with pytest.raises(ValueError, match=message):
        store_kv(**{k: v.to(device) for k, v in args.items()})
