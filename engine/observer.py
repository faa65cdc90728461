"""The engine's observer interface: what probes and servers can watch without the engine knowing them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from engine.request import RequestId


@dataclass(slots=True)
class StepStats:
    """One engine step: where its wall time went and the state it left behind.

    Times are seconds measured with ``time.perf_counter`` around each phase on the host; on a
    GPU, ``forward_s`` covers the kernels because the runner synchronizes before sampling.
    """

    step_index: int
    start_time: float  # time.time() at step start, comparable with request event times
    schedule_s: float
    prepare_s: float
    forward_s: float
    sample_s: float
    output_s: float
    host_overhead_s: float  # time deliberately burnt by EngineConfig.host_overhead_ms
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_kv_blocks_used: int
    num_kv_blocks_free: int
    num_kv_blocks_cached: int
    num_kv_slots_allocated: int  # token slots in blocks owned by running requests
    num_kv_slots_used: int  # of those, slots holding a computed token
    num_preemptions: int  # in this step
    num_prefix_hit_tokens: int  # in this step

    @property
    def total_s(self) -> float:
        return (self.schedule_s + self.prepare_s + self.forward_s + self.sample_s + self.output_s
                + self.host_overhead_s)


class RequestEventKind(enum.Enum):
    ARRIVED = "arrived"
    SCHEDULED = "scheduled"  # admitted to the running batch (first time, or again after preemption)
    TOKEN = "token"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(slots=True)
class RequestEvent:
    request_id: RequestId
    kind: RequestEventKind
    time: float  # time.time()
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0
    finish_reason: str | None = None


class EngineObserver(Protocol):
    """Attach with ``LLMEngine.add_observer``; called on the engine's thread, keep it cheap."""

    def on_step(self, stats: StepStats) -> None: ...

    def on_request_event(self, event: RequestEvent) -> None: ...
