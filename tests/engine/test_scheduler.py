"""Scheduler without a model: batching limits, chunked prefill, preemption, abort, invariants."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.model.config import LlamaConfig
from engine.request import Request, RequestId, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler

TINY = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, max_position_embeddings=1024)
EOS = 0


def make_scheduler(**overrides: object) -> Scheduler:
    fields: dict[str, object] = {"model": "dummy:tiny", "max_model_len": 128, "num_kv_blocks": 64,
                                 "block_size": 4, "max_num_seqs": 4}
    fields.update(overrides)
    return Scheduler(EngineConfig(**fields).finalize(TINY), frozenset({EOS}))  # type: ignore[arg-type]


_ids = itertools.count()


def add(s: Scheduler, prompt_len: int, max_tokens: int = 4, prefix: list[int] | None = None) -> Request:
    tokens = (prefix or []) + [1 + (i % 200) for i in range(prompt_len)]
    request = Request(RequestId(f"r{next(_ids)}"), tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                      s.config.max_model_len)  # type: ignore[arg-type]
    s.add_request(request)
    return request


def run_step(s: Scheduler, token: int = 7) -> None:
    out = s.schedule()
    assert out.num_scheduled_tokens <= s.max_num_batched_tokens
    assert len(out.scheduled) <= s.config.max_num_seqs
    s.update(out, {item.request.request_id: token for item in out.scheduled if item.samples_token})


def drain(s: Scheduler, max_steps: int = 10_000) -> int:
    steps = 0
    while s.has_unfinished():
        run_step(s)
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    return steps


def assert_pool_idle(s: Scheduler) -> None:
    bm = s.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_requests_batch_together_under_max_num_seqs() -> None:
    s = make_scheduler(max_num_seqs=3)
    for _ in range(5):
        add(s, 6)
    out = s.schedule()
    assert len(out.scheduled) == 3
    assert s.num_waiting == 2


def test_chunked_prefill_splits_a_long_prompt_over_steps() -> None:
    s = make_scheduler(max_num_batched_tokens=8)
    request = add(s, 20, max_tokens=2)
    chunks = []
    while request.num_output_tokens == 0:
        out = s.schedule()
        chunks.append(out.scheduled[0].num_new_tokens)
        s.update(out, {request.request_id: 7} if out.scheduled[0].samples_token else {})
    assert chunks == [8, 8, 4]
    drain(s)
    assert request.status == RequestStatus.FINISHED_LENGTH
    assert_pool_idle(s)


def test_without_chunked_prefill_a_prompt_is_scheduled_whole() -> None:
    s = make_scheduler(enable_chunked_prefill=False)
    request = add(s, 100)
    out = s.schedule()
    assert out.scheduled[0].num_new_tokens == 100
    assert out.scheduled[0].samples_token
    s.update(out, {request.request_id: 7})


def test_decode_runs_alongside_a_new_prefill() -> None:
    s = make_scheduler(max_num_batched_tokens=16)
    first = add(s, 4, max_tokens=10)
    run_step(s)
    add(s, 30)
    out = s.schedule()
    assert [item.num_new_tokens for item in out.scheduled] == [1, 15]
    assert out.num_decode_tokens == 1 and out.num_prefill_tokens == 15
    assert first.num_output_tokens == 1


def test_preemption_by_recompute_when_pool_runs_dry() -> None:
    s = make_scheduler(num_kv_blocks=32, max_model_len=128, max_num_seqs=8)
    requests = [add(s, 20, max_tokens=40) for _ in range(4)]
    drain(s)
    assert s.num_preemptions_total > 0
    assert all(r.status == RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 40 for r in requests)
    assert_pool_idle(s)


def test_stop_on_eos_and_stop_token_ids() -> None:
    s = make_scheduler()
    eos_req = Request(RequestId("eos"), [1, 2, 3], SamplingParams(max_tokens=10), 128)
    stop_req = Request(RequestId("stop"), [1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=[5]), 128)
    s.add_request(eos_req)
    s.add_request(stop_req)
    out = s.schedule()
    s.update(out, {"eos": EOS, "stop": 5})
    assert eos_req.status == RequestStatus.FINISHED_STOPPED and eos_req.stop_reason is None
    assert stop_req.status == RequestStatus.FINISHED_STOPPED and stop_req.stop_reason == 5
    assert_pool_idle(s)


def test_generation_stops_at_max_model_len() -> None:
    s = make_scheduler(max_model_len=16)
    request = add(s, 12, max_tokens=100)
    drain(s)
    assert request.num_tokens == 16 and request.status == RequestStatus.FINISHED_LENGTH


def test_prefix_hits_skip_computation() -> None:
    s = make_scheduler()
    shared = [50 + i for i in range(12)]
    first = add(s, 2, prefix=shared)
    drain(s)
    second = add(s, 2, prefix=shared)
    out = s.schedule()
    assert out.num_prefix_hit_tokens == 12
    assert out.scheduled[0].num_new_tokens == second.num_tokens - 12
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 12


def test_abort_frees_blocks_wherever_the_request_is() -> None:
    s = make_scheduler(max_num_seqs=1)
    running = add(s, 10, max_tokens=50)
    waiting = add(s, 10)
    run_step(s)
    assert s.finish_request(running.request_id, RequestStatus.FINISHED_ABORTED) is running
    assert s.finish_request(waiting.request_id, RequestStatus.FINISHED_ABORTED) is waiting
    assert s.finish_request(RequestId("nope"), RequestStatus.FINISHED_ABORTED) is None
    assert not s.has_unfinished()
    assert_pool_idle(s)


def test_duplicate_request_id_is_rejected() -> None:
    s = make_scheduler()
    request = add(s, 3)
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(Request(request.request_id, [1], SamplingParams(), 128))


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(["add", "step", "abort"]), st.integers(1, 60), st.integers(1, 12)),
                 min_size=1, max_size=40),
    num_blocks=st.integers(32, 80),
    budget=st.integers(4, 64),
    prefix_caching=st.booleans(),
    chunked=st.booleans(),
)
def test_random_add_step_abort_keeps_invariants(ops: list[tuple[str, int, int]], num_blocks: int, budget: int,
                                                prefix_caching: bool, chunked: bool) -> None:
    s = make_scheduler(num_kv_blocks=num_blocks, max_num_batched_tokens=max(budget, 128) if not chunked else budget,
                       enable_prefix_caching=prefix_caching, enable_chunked_prefill=chunked, max_num_seqs=6)
    live: list[Request] = []
    for op, length, max_tokens in ops:
        if op == "add":
            live.append(add(s, length, max_tokens, prefix=[3] * 8 if length % 2 else None))
        elif op == "step":
            run_step(s)
        elif live:
            s.finish_request(live.pop(length % len(live)).request_id, RequestStatus.FINISHED_ABORTED)
        bm = s.block_manager
        owned = [b for r in s.running for b in r.block_ids]
        assert all(r.block_ids == [] for r in s.waiting)
        assert bm.num_used_blocks == len(set(owned))
        for block in bm.blocks:
            assert block.ref_count == owned.count(block.block_id)
        for r in s.running:
            assert len(r.block_ids) * bm.block_size >= r.num_computed_tokens
        assert bm.num_cached_free_blocks == sum(1 for b in bm.free_queue if b.block_hash is not None)
    drain(s)
    assert_pool_idle(s)
    finished = [r for r in live if r.status != RequestStatus.FINISHED_ABORTED]
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in finished)


def test_prefix_lookups_count_once_per_admission() -> None:
    s = make_scheduler(max_num_seqs=1)
    add(s, 10, max_tokens=5)
    blocked = add(s, 10, max_tokens=5)
    for _ in range(3):
        run_step(s)  # the second request waits: its repeated lookups are not queries
    assert s.block_manager.num_prefix_query_tokens == 10
    drain(s)
    assert s.block_manager.num_prefix_query_tokens == 10 + blocked.num_prompt_tokens
