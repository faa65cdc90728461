"""Block manager: allocation, sharing, eviction and the ref-count invariants."""

from __future__ import annotations

import pytest

from engine.block_manager import BlockManager
from engine.request import Request, RequestId
from engine.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int], max_model_len: int = 1024) -> Request:
    return Request(RequestId(rid), tokens, SamplingParams(max_tokens=8), max_model_len)


def assert_all_free(bm: BlockManager) -> None:
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


def compute(bm: BlockManager, request: Request, num_tokens: int) -> None:
    """Allocate and mark ``num_tokens`` as computed, as one engine step would."""
    assert bm.allocate_slots(request, num_tokens)
    request.num_computed_tokens += num_tokens
    bm.cache_full_blocks(request)


def test_allocation_rounds_up_to_blocks_and_free_returns_everything() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    request = make_request("a", list(range(10)))
    assert bm.allocate_slots(request, 10)
    assert len(request.block_ids) == 3
    assert bm.num_free_blocks == 5
    bm.free(request)
    assert request.block_ids == []
    assert_all_free(bm)


def test_allocation_fails_without_side_effects_when_pool_is_short() -> None:
    bm = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    request = make_request("a", list(range(12)))
    assert not bm.allocate_slots(request, 12)
    assert request.block_ids == []
    assert_all_free(bm)


def test_prefix_hit_shares_blocks_and_rechecks_tokens() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = make_request("a", list(range(10)))
    compute(bm, first, 10)
    second = make_request("b", list(range(8)) + [99, 98, 97])
    hits = bm.find_cached_prefix(second)
    assert [b.block_id for b in hits] == first.block_ids[:2]
    assert bm.allocate_slots(second, second.num_tokens - 8, hits)
    assert bm.blocks[first.block_ids[0]].ref_count == 2
    bm.free(first)
    bm.free(second)
    assert_all_free(bm)
    assert bm.num_cached_free_blocks == 2  # both full blocks stay reusable


def test_hash_collision_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.block_manager as bm_module

    monkeypatch.setattr(bm_module, "hash_block", lambda parent, tokens: bm_module.BlockHash(7))
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = make_request("a", [1, 2, 3, 4, 5])
    compute(bm, first, 5)
    other = make_request("b", [9, 9, 9, 9, 9])
    assert bm.find_cached_prefix(other) == []


def test_prefix_never_covers_the_whole_prompt() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = make_request("a", list(range(8)))
    compute(bm, first, 8)
    same = make_request("b", list(range(8)))
    assert len(bm.find_cached_prefix(same)) == 1  # the last token must be computed to sample


def test_lru_evicts_oldest_cached_block_first() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    old = make_request("old", [1, 2, 3])
    compute(bm, old, 3)
    bm.free(old)
    new = make_request("new", [5, 6, 7])
    compute(bm, new, 3)
    bm.free(new)
    # Four blocks: [old-tail, old-head, new-tail, new-head] in LRU order. Taking two evicts old's.
    grab = make_request("grab", [40, 41, 42])
    assert bm.allocate_slots(grab, 3)
    assert bm.find_cached_prefix(make_request("x", [1, 2, 3])) == []
    assert len(bm.find_cached_prefix(make_request("y", [5, 6, 7]))) == 1


def test_contiguous_layout_reserves_max_len_up_front() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False, reserve_tokens_per_seq=32)
    request = make_request("a", [1, 2, 3])
    assert bm.allocate_slots(request, 3)
    assert len(request.block_ids) == 8
    request.num_computed_tokens = 3
    assert bm.allocate_slots(request, 1)
    assert len(request.block_ids) == 8


def test_double_free_is_caught() -> None:
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    request = make_request("a", [1, 2])
    assert bm.allocate_slots(request, 2)
    ids = list(request.block_ids)
    bm.free(request)
    request.block_ids = ids
    with pytest.raises(AssertionError, match="freed more often"):
        bm.free(request)


def test_invalid_sizes_raise() -> None:
    with pytest.raises(ValueError, match="positive"):
        BlockManager(num_blocks=0, block_size=16, enable_prefix_caching=True)


def test_cached_free_count_tracks_the_free_queue() -> None:
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=True)

    def counted() -> int:
        return sum(1 for b in bm.free_queue if b.block_hash is not None)

    first = make_request("a", [1, 2, 3, 4, 5])
    compute(bm, first, 5)
    assert bm.num_cached_free_blocks == counted() == 0
    bm.free(first)
    assert bm.num_cached_free_blocks == counted() == 2
    again = make_request("b", [1, 2, 3, 4, 9])
    assert bm.allocate_slots(again, 1, bm.find_cached_prefix(again))  # revives both cached blocks
    assert bm.num_cached_free_blocks == counted() == 0
    bm.free(again)
    filler = make_request("c", list(range(100, 116)))
    assert bm.allocate_slots(filler, 16)  # takes every block, evicting the cached ones
    assert bm.num_cached_free_blocks == counted() == 0
    bm.free(filler)
    bm.reset_prefix_cache()
    assert bm.num_cached_free_blocks == counted() == 0
