"""Paged KV-cache bookkeeping: fixed-size blocks, ref counts, a free queue and prefix caching."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NewType

from engine.request import BlockId, Request, RequestId

BlockHash = NewType("BlockHash", int)


@dataclass(slots=True, eq=False)
class Block:
    """One KV block: ``block_size`` token slots in every layer's cache."""

    block_id: BlockId
    ref_count: int = 0
    block_hash: BlockHash | None = None
    # NOTE: a block with a hash also keeps its tokens, so a hash hit is confirmed against the
    # request's tokens before reuse; a hash collision can never serve the wrong K/V.
    token_ids: tuple[int, ...] | None = None


class FreeBlockQueue:
    """Blocks with no reference, least recently freed first, O(1) append, pop and removal.

    Blocks that still carry a prefix hash stay reusable here until they are popped for a new
    allocation: the front of the queue is evicted first (LRU).
    """

    def __init__(self, blocks: Sequence[Block]) -> None:
        self._blocks: OrderedDict[BlockId, Block] = OrderedDict((b.block_id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: Block) -> bool:
        return block.block_id in self._blocks

    def __iter__(self) -> Iterator[Block]:
        return iter(self._blocks.values())

    def append(self, block: Block) -> None:
        self._blocks[block.block_id] = block

    def popleft(self) -> Block:
        return self._blocks.popitem(last=False)[1]

    def remove(self, block: Block) -> None:
        del self._blocks[block.block_id]


def hash_block(parent: BlockHash | None, token_ids: tuple[int, ...]) -> BlockHash:
    """Chained hash: a block's identity depends on every token before it."""
    return BlockHash(hash((parent, token_ids)))


class BlockManager:
    """Owns every KV block and hands them to requests.

    With ``reserve_tokens_per_seq`` set, a request's first allocation reserves that many token
    slots at once (the contiguous, max-length layout a static server uses), out of the same pool.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 reserve_tokens_per_seq: int | None = None) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.reserve_blocks_per_seq = (
            math.ceil(reserve_tokens_per_seq / block_size) if reserve_tokens_per_seq else 0
        )
        self.blocks: list[Block] = [Block(BlockId(i)) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached_blocks: dict[BlockHash, Block] = {}
        self._block_hashes: dict[RequestId, list[BlockHash]] = {}
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0
        # NOTE: kept equal to the number of free blocks holding a hash, so stats stay O(1).
        self._num_cached_free = 0

    # -- queries -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix."""
        return self._num_cached_free

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def find_cached_prefix(self, request: Request) -> list[Block]:
        """The longest run of cached full blocks matching the start of the request's tokens.

        NOTE: at least one token is always left to compute, since the step that computes it
        produces the logits the next token is sampled from.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._hashes_for(request, max_blocks)
        hits: list[Block] = []
        for index, block_hash in enumerate(hashes[:max_blocks]):
            block = self.cached_blocks.get(block_hash)
            if block is None or block.token_ids != self._block_tokens(request, index):
                break
            hits.append(block)
        return hits

    def record_prefix_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup (not the retries of a request left waiting)."""
        self.num_prefix_query_tokens += num_query_tokens
        self.num_prefix_hit_tokens += num_hit_tokens

    # -- allocation --------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       cached_prefix: Sequence[Block] = ()) -> bool:
        """Give the request blocks for ``num_new_tokens`` more tokens; False if the pool is short.

        ``cached_prefix`` (from :meth:`find_cached_prefix`, only on a request's first allocation)
        is shared, not copied. Nothing changes when this returns False.
        """
        num_covered = request.num_computed_tokens + len(cached_prefix) * self.block_size + num_new_tokens
        num_required = math.ceil(num_covered / self.block_size)
        if not request.block_ids:
            num_required = max(num_required, self.reserve_blocks_per_seq)
        num_new_blocks = num_required - len(request.block_ids) - len(cached_prefix)
        num_revived = sum(1 for b in cached_prefix if b.ref_count == 0)
        if num_new_blocks > len(self.free_queue) - num_revived:
            return False
        for block in cached_prefix:
            if block.ref_count == 0:
                self.free_queue.remove(block)
                self._num_cached_free -= 1
            block.ref_count += 1
            request.block_ids.append(block.block_id)
        for _ in range(max(num_new_blocks, 0)):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_count = 1
            request.block_ids.append(block.block_id)
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's newly filled blocks so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        hashes = self._hashes_for(request, num_full)
        for index in range(num_full):
            block = self.blocks[request.block_ids[index]]
            if block.block_hash is not None:
                continue
            block_hash = hashes[index]
            if block_hash in self.cached_blocks:
                continue  # the same content is already cached in another block
            block.block_hash = block_hash
            block.token_ids = self._block_tokens(request, index)
            self.cached_blocks[block_hash] = block

    def free(self, request: Request) -> None:
        """Drop the request's references; unreferenced blocks join the free queue."""
        # NOTE: freed tail-first, so a request's last blocks are evicted before its shared prefix.
        for block_id in reversed(request.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed more often than allocated"
            if block.ref_count == 0:
                self.free_queue.append(block)
                self._num_cached_free += block.block_hash is not None
        request.block_ids = []
        self._block_hashes.pop(request.request_id, None)

    def reset_prefix_cache(self) -> None:
        for block in self.cached_blocks.values():
            block.block_hash = None
            block.token_ids = None
        self.cached_blocks.clear()
        self._num_cached_free = 0

    # -- helpers -----------------------------------------------------------------------------
    def _evict(self, block: Block) -> None:
        """Drop the prefix a block popped from the free queue still held."""
        if block.block_hash is not None:
            self._num_cached_free -= 1
            if self.cached_blocks.get(block.block_hash) is block:
                del self.cached_blocks[block.block_hash]
            block.block_hash = None
            block.token_ids = None

    def _block_tokens(self, request: Request, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(request.all_token_ids[start:start + self.block_size])

    def _hashes_for(self, request: Request, num_blocks: int) -> list[BlockHash]:
        hashes = self._block_hashes.setdefault(request.request_id, [])
        while len(hashes) < num_blocks:
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, self._block_tokens(request, len(hashes))))
        return hashes
