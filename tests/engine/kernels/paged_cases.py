"""Random paged KV caches with shuffled block tables, shared by the attention tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Per-dtype tolerances for a kernel run in ``dtype`` against a float32 reference computed from
# the same (already rounded) inputs: about two units in the last place of the output.
ATTENTION_TOLERANCES = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}


@dataclass(slots=True)
class PagedCache:
    """Caches whose slots outside every sequence's context hold NaN (``k_cache``/``v_cache``)
    or zero (``clean_k``/``clean_v``): a kernel that reads a stray slot turns NaN."""

    k_cache: torch.Tensor  # [N, block_size, KVH, D]
    v_cache: torch.Tensor
    clean_k: torch.Tensor
    clean_v: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks], padded with 0
    seq_lens: torch.Tensor  # [B]


def make_paged_cache(seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int,
                     dtype: torch.dtype, device: torch.device, seed: int,
                     index_dtype: torch.dtype = torch.int64, spare_blocks: int = 3) -> PagedCache:
    generator = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=generator).tolist()  # shuffled, non-contiguous
    width = max(blocks_per_seq, default=0) + 1
    block_tables = torch.zeros((len(seq_lens), width), dtype=torch.int64)
    is_context = torch.zeros((num_blocks, block_size), dtype=torch.bool)  # [N, block_size]
    next_block = 0
    for row, (seq_len, count) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        blocks = torch.tensor(order[next_block : next_block + count], dtype=torch.int64)
        next_block += count
        block_tables[row, :count] = blocks
        is_context.view(-1)[(blocks[:, None] * block_size + torch.arange(block_size)).flatten()[:seq_len]] = True
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=generator).to(dtype)
    v = torch.randn(shape, generator=generator).to(dtype)
    stray = ~is_context[:, :, None, None]
    return PagedCache(
        k_cache=k.masked_fill(stray, float("nan")).to(device),
        v_cache=v.masked_fill(stray, float("nan")).to(device),
        clean_k=k.masked_fill(stray, 0.0),
        clean_v=v.masked_fill(stray, 0.0),
        block_tables=block_tables.to(index_dtype).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=index_dtype, device=device),
    )


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype).to(device)
