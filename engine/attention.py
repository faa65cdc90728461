"""Attention over the paged KV cache in plain torch (the CPU path and the kernels' reference)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


class GatherWorkspace:
    """Reused output buffers for the decode gather of K and V, grown on demand, never shrunk.

    Why: a fresh gather output per layer is memory the allocator may have handed back to the OS,
    so every step pays page faults and cold writes for it; one buffer pair that every layer writes
    in turn stays mapped and warm (docs/results.md, "The engine", has the figures). The
    optimized path owns one; eager allocates per call, as a plain framework forward does.
    """

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None  # [capacity, block_size, KVH, D]
        self._values: torch.Tensor | None = None

    def gather(self, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``k_cache[block_ids]`` and ``v_cache[block_ids]``, written into the reused buffers.

        The views returned are overwritten by the next call: use them before gathering again.
        """
        num_rows = block_ids.numel()
        if self._keys is None or self._keys.shape[0] < num_rows or self._keys.shape[1:] != k_cache.shape[1:] \
                or self._keys.dtype != k_cache.dtype or self._keys.device != k_cache.device:
            capacity = max(num_rows, 2 * self._keys.shape[0] if self._keys is not None else 0)
            self._keys = k_cache.new_empty((capacity, *k_cache.shape[1:]))
            self._values = v_cache.new_empty((capacity, *v_cache.shape[1:]))
        assert self._values is not None
        keys = torch.index_select(k_cache, 0, block_ids, out=self._keys[:num_rows])
        values = torch.index_select(v_cache, 0, block_ids, out=self._values[:num_rows])
        return keys, values


def padded_tables(block_tables: list[list[int]]) -> tuple[list[int], int]:
    """Block tables flattened row by row, each padded with 0 to the longest (at least 1): ``(values, width)``."""
    width = max((len(t) for t in block_tables), default=1) or 1
    return [value for blocks in block_tables for value in (*blocks, *[0] * (width - len(blocks)))], width


@dataclass(slots=True)
class AttentionMetadata:
    """Where each sequence's tokens sit in the flat batch and in the paged cache.

    The batch is the concatenation of every scheduled sequence's new tokens; sequence ``i`` owns
    rows ``query_start_loc[i]:query_start_loc[i + 1]`` and attends over its first
    ``seq_lens[i]`` cached tokens (earlier context plus the new ones).
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot (block_id * block_size + offset) per token
    block_tables: torch.Tensor  # [B, max_blocks] int64, padded with 0
    query_start_loc: list[int]  # B + 1 offsets into the flat batch
    seq_lens: list[int]  # [B] context length after this step
    decode_ids: list[int]  # sequences with exactly one new token
    prefill_ids: list[int]  # the others (prompt chunks, recompute)
    decode_seq_lens: torch.Tensor | None = None  # [Bd] int64
    decode_block_tables: torch.Tensor | None = None  # [Bd, max_blocks] int64
    # The same metadata as device tensors, built once per step for kernels (never per layer).
    seq_lens_t: torch.Tensor | None = None  # [B] int32
    query_start_loc_t: torch.Tensor | None = None  # [B + 1] int32
    max_query_len: int = 0
    # Set by the runner on the optimized path: decode reuses its gather buffers across layers and steps.
    workspace: GatherWorkspace | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @classmethod
    def build(cls, slot_mapping: list[int], block_tables: list[list[int]], query_lens: list[int],
              seq_lens: list[int], device: torch.device | str = "cpu") -> AttentionMetadata:
        # NOTE: built every step, so a one-token decode step of a small model pays it per token: each tensor
        # made from a list costs a few microseconds of Python, so the integers go in as few tensors as can hold
        # them (one int64, one int32) and the fields are views of those.
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        num_seqs, num_slots = len(seq_lens), len(slot_mapping)
        padded, width = padded_tables(block_tables)
        longs = torch.tensor(slot_mapping + seq_lens + padded, dtype=torch.int64).to(device, non_blocking=True)
        ints = torch.tensor(seq_lens + starts, dtype=torch.int32).to(device, non_blocking=True)
        table = longs[num_slots + num_seqs:].view(num_seqs, width)
        decode_ids = [i for i, n in enumerate(query_lens) if n == 1]
        prefill_ids = [i for i, n in enumerate(query_lens) if n != 1]
        meta = cls(
            slot_mapping=longs[:num_slots],
            block_tables=table,
            query_start_loc=starts,
            seq_lens=list(seq_lens),
            decode_ids=decode_ids,
            prefill_ids=prefill_ids,
            max_query_len=max(query_lens, default=0),
            seq_lens_t=ints[:num_seqs],
            query_start_loc_t=ints[num_seqs:],
        )
        if len(decode_ids) == num_seqs and num_seqs:  # every row decodes, in order: the whole table and lengths
            meta.decode_seq_lens = longs[num_slots:num_slots + num_seqs]
            meta.decode_block_tables = table
        elif decode_ids:
            index = torch.tensor(decode_ids, dtype=torch.int64, device=longs.device)
            meta.decode_seq_lens = longs[num_slots:num_slots + num_seqs].index_select(0, index)
            meta.decode_block_tables = table.index_select(0, index)
        return meta


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write new keys/values ``[T, KVH, D]`` into their slots of ``[N, block_size, KVH, D]`` caches."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first ``seq_len`` cached tokens of one sequence: ``[seq_len, KVH, D]``."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = cache.index_select(0, block_table[:num_blocks])  # [nb, bs, KVH, D]
    return blocks.flatten(0, 1)[:seq_len]


DecodeAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float], torch.Tensor]


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, decode: DecodeAttention | None = None) -> torch.Tensor:
    """Causal attention of every new token over its sequence's cached context.

    query ``[T, H, D]``; caches ``[N, block_size, KVH, D]`` already hold this step's keys and
    values. Decode rows go through ``decode`` (by default :func:`_decode_attention`: two batched
    matmuls over the gathered blocks); each prefill chunk gets its own SDPA call with the causal
    mask shifted by its earlier context. Returns ``[T, H, D]``.
    """
    out = torch.empty_like(query)
    if meta.decode_ids:
        decode = decode or _decode_attention
        if len(meta.decode_ids) == meta.num_seqs:
            return decode(query, k_cache, v_cache, meta, scale)  # every row is a decode row, in order
        rows = torch.tensor([meta.query_start_loc[i] for i in meta.decode_ids], dtype=torch.int64,
                            device=query.device)
        out.index_copy_(0, rows, decode(query.index_select(0, rows), k_cache, v_cache, meta, scale))
    for i in meta.prefill_ids:
        start, end = meta.query_start_loc[i], meta.query_start_loc[i + 1]
        seq_len = meta.seq_lens[i]
        keys = gather_context(k_cache, meta.block_tables[i], seq_len).transpose(0, 1)  # [KVH, S, D]
        values = gather_context(v_cache, meta.block_tables[i], seq_len).transpose(0, 1)
        # NOTE: batched 4-D inputs: with 3-D ones torch's CPU SDPA takes its unfused math path for GQA,
        # a third of a 512-token prefill step on this model (docs/results.md, "The engine").
        q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, H, Q, D]
        keys, values = keys.unsqueeze(0), values.unsqueeze(0)
        num_new = end - start
        if num_new == seq_len:
            attn = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale, enable_gqa=True)
        else:
            # NOTE: new token j sits at position seq_len - num_new + j and sees keys up to there.
            q_pos = torch.arange(seq_len - num_new, seq_len, device=query.device).unsqueeze(1)
            mask = torch.arange(seq_len, device=query.device).unsqueeze(0) <= q_pos  # [Q, S]
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:end] = attn[0].transpose(0, 1)
    return out


def _decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """One query per sequence: two batched matmuls over the gathered blocks, with no layout copies.

    GQA without a permute: each query head is laid into a zero row ``[KVH * D]`` at its KV head's
    slice, so one ``bmm`` against the gathered ``[S, KVH * D]`` keys gives every head's scores,
    and the output's diagonal blocks are each head's values. That spends KVH times the (tiny)
    FLOPs to read K and V once, in place. Scores and values stay in the cache dtype and the softmax
    runs in float32, as HF's eager attention does.

    NOTE: no permuted copies of K or V: on CPU such layout copies cost more of the step than the
    attention itself (docs/results.md, "The engine").
    """
    assert meta.decode_seq_lens is not None and meta.decode_block_tables is not None
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = max(meta.seq_lens[i] for i in meta.decode_ids)  # from the host list: no device sync
    num_blocks = -(-max_len // block_size)
    flat_tables = meta.decode_block_tables[:, :num_blocks].reshape(-1)
    gathered = (num_seqs, num_blocks * block_size, num_kv_heads * head_dim)
    if meta.workspace is not None:
        keys, values = meta.workspace.gather(k_cache, v_cache, flat_tables)
    else:
        keys, values = k_cache.index_select(0, flat_tables), v_cache.index_select(0, flat_tables)
    keys, values = keys.view(gathered), values.view(gathered)  # [Bd, S, KVH * D], contiguous
    # Query head h reads KV head h // group, as in HF's repeat_kv.
    spread = query.new_zeros(num_seqs, num_kv_heads, group, num_kv_heads, head_dim)
    spread.diagonal(dim1=1, dim2=3).copy_(query.view(num_seqs, num_kv_heads, group, head_dim).permute(0, 2, 3, 1))
    scores = torch.bmm(spread.view(num_seqs, num_heads, -1), keys.transpose(1, 2))  # [Bd, H, S]
    pad = torch.arange(gathered[1], device=query.device).unsqueeze(0) >= meta.decode_seq_lens.unsqueeze(1)
    acc = torch.promote_types(query.dtype, torch.float32)  # float32 at least (float64 stays float64)
    weights = (scores.to(acc) * scale).masked_fill_(pad.unsqueeze(1), float("-inf")).softmax(-1)
    out = torch.bmm(weights.to(values.dtype), values)  # [Bd, H, KVH * D]
    blocks = out.view(num_seqs, num_kv_heads, group, num_kv_heads, head_dim).diagonal(dim1=1, dim2=3)
    return blocks.permute(0, 3, 1, 2).reshape(num_seqs, num_heads, head_dim)  # [Bd, G, D, KVH] -> [Bd, H, D]


class AttentionBackend(Protocol):
    """The two cache operations a layer needs; the runner picks the implementation."""

    name: str

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None: ...

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class TorchAttentionBackend:
    """Plain torch: index_copy for the store, SDPA over gathered blocks for attention.

    ``decode`` replaces the decode rows' attention (the CPU's C kernel, ``engine.cpu_kernels``);
    prompt chunks always take SDPA, which torch does well at their GEMM-like shapes.
    """

    name: str = "torch"
    decode: DecodeAttention | None = None

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        store_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return paged_attention(query, k_cache, v_cache, meta, scale, self.decode)


TORCH_BACKEND = TorchAttentionBackend()
