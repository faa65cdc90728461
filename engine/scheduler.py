"""Iteration-level continuous batching: which requests advance by how many tokens this step."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.output_processor import stop_status
from engine.request import Request, RequestId, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    """A request and the tokens ``[start, start + num_new_tokens)`` it computes this step.

    ``samples_token`` is True when the step catches the request up, so the logits of its last
    token give the next one. Both are fixed when scheduled; the request itself moves on after.
    """

    request: Request
    num_new_tokens: int
    start: int = field(init=False)
    samples_token: bool = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.request.num_computed_tokens
        self.samples_token = self.start + self.num_new_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """What one engine step computes; the model runner reads only this."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[RequestId] = field(default_factory=list)
    newly_scheduled_ids: list[RequestId] = field(default_factory=list)
    num_prefix_hit_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def num_decode_tokens(self) -> int:
        """Tokens of requests past their prompt (generated tokens being fed back)."""
        return sum(s.num_new_tokens for s in self.scheduled if s.start >= s.request.num_prompt_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_scheduled_tokens - self.num_decode_tokens


@dataclass(slots=True)
class TokenUpdate:
    """The result of a step for one request."""

    request: Request
    new_token_id: int | None
    is_first_token: bool


class Scheduler:
    """FCFS continuous batching under ``max_num_seqs`` and ``max_num_batched_tokens``.

    Running requests are served first, oldest first; when the KV pool runs dry the newest
    running request is preempted (its blocks freed, to be recomputed later). Waiting requests
    are admitted while the token budget, the sequence cap and the pool allow.
    """

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int] = frozenset()) -> None:
        assert config.is_finalized, "the scheduler needs a finalized EngineConfig"
        self.config = config
        self.eos_token_ids = eos_token_ids
        self.max_num_batched_tokens: int = config.max_num_batched_tokens  # type: ignore[assignment]
        contiguous = config.kv_layout == "contiguous"
        self.block_manager = BlockManager(
            num_blocks=config.num_kv_blocks,  # type: ignore[arg-type]
            block_size=config.block_size,
            enable_prefix_caching=config.enable_prefix_caching and not contiguous,
            reserve_tokens_per_seq=config.max_model_len if contiguous else None,
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[RequestId, Request] = {}
        self.num_preemptions_total = 0

    # -- queue management ---------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def kv_slot_usage(self) -> tuple[int, int]:
        """(token slots allocated to running requests, slots of those holding computed tokens)."""
        allocated = sum(len(r.block_ids) for r in self.running) * self.block_manager.block_size
        return allocated, sum(r.num_computed_tokens for r in self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_request(self, request_id: RequestId, status: RequestStatus) -> Request | None:
        """Finish (or abort) a request wherever it is; returns it, or None if unknown."""
        assert status.is_finished
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self.block_manager.free(request)
        return request

    # -- one step -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        chunked = self.config.enable_chunked_prefill

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.block_manager.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted_ids.append(victim.request_id)
                if victim is request:
                    break
            else:
                out.scheduled.append(ScheduledRequest(request, num_new))
                budget -= num_new
                index += 1

        if not out.preempted_ids:
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                request = self.waiting[0]
                cached_prefix = self.block_manager.find_cached_prefix(request)
                num_cached = len(cached_prefix) * self.block_manager.block_size
                num_new = request.num_tokens - num_cached
                if not chunked and num_new > budget:
                    break
                num_new = min(num_new, budget)
                if not self.block_manager.allocate_slots(request, num_new, cached_prefix):
                    break
                self.waiting.popleft()
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_cached
                request.num_cached_tokens = max(request.num_cached_tokens, num_cached)
                self.running.append(request)
                out.scheduled.append(ScheduledRequest(request, num_new))  # after num_computed_tokens is set
                out.newly_scheduled_ids.append(request.request_id)
                out.num_prefix_hit_tokens += num_cached
                if self.block_manager.enable_prefix_caching:
                    self.block_manager.record_prefix_lookup(request.num_tokens, num_cached)
                budget -= num_new
        return out

    def update(self, out: SchedulerOutput, sampled: dict[RequestId, int]) -> list[TokenUpdate]:
        """Advance every scheduled request past the tokens it computed; append sampled tokens."""
        updates: list[TokenUpdate] = []
        for item in out.scheduled:
            request = item.request
            catches_up = item.samples_token
            request.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(request)
            if not catches_up:
                continue
            token_id = sampled[request.request_id]
            is_first = request.num_output_tokens == 0
            request.append_output_token(token_id)
            updates.append(TokenUpdate(request, token_id, is_first))
            status = stop_status(request, token_id, self.eos_token_ids)
            if status is not None:
                self.finish_request(request.request_id, status)
        return updates

    # -- helpers ------------------------------------------------------------------------------
    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(request)
