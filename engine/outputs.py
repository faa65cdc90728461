"""What the engine hands back per request and per step."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import RequestId


@dataclass(slots=True)
class RequestOutput:
    """A request's output so far; ``new_*`` fields hold what this step added (for streaming)."""

    request_id: RequestId
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    logprobs: list[TokenLogprob] | None = None  # every output token's, when the request asked for them
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    error: str | None = None  # why the engine failed this request (finish_reason "error")


@dataclass(slots=True)
class EngineStats:
    """A snapshot of the engine's queues and KV pool."""

    num_running: int
    num_waiting: int
    num_kv_blocks: int
    num_kv_blocks_used: int
    num_kv_blocks_free: int
    num_kv_blocks_cached: int
    num_preemptions_total: int
    num_prefix_query_tokens: int
    num_prefix_hit_tokens: int
    num_steps: int
    num_kv_slots_allocated: int = 0  # token slots held by running requests
    num_kv_slots_used: int = 0  # of those, slots holding a computed token

    @property
    def kv_cache_usage(self) -> float:
        return self.num_kv_blocks_used / self.num_kv_blocks if self.num_kv_blocks else 0.0


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """One sampled token's log-probability and the most likely alternatives at its position.

    NOTE: log-probabilities are of the model's raw distribution (log-softmax of the logits, before
    temperature, filters and the min_tokens mask), as vLLM reports them by default.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first
