"""A request's state as the scheduler and block manager see it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import NewType

from engine.sampling_params import SamplingParams

RequestId = NewType("RequestId", str)
BlockId = NewType("BlockId", int)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # the engine raised while running this request; it failed alone

    @property
    def is_finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)


@dataclass(slots=True, eq=False)
class Request:
    """One generation request.

    NOTE: progress follows one rule: ``num_computed_tokens`` (tokens whose K/V sit in the cache)
    catches up with ``num_tokens`` (prompt + generated). Prefill, chunked prefill, decode,
    prefix-cache hits and recompute after preemption are all that rule.
    """

    request_id: RequestId
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_model_len: int
    arrival_time: float = field(default_factory=time.time)
    all_token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_ids: list[BlockId] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: the prompt is empty")
        if len(self.prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"request {self.request_id!r}: the prompt has {len(self.prompt_token_ids)} tokens, "
                f"which leaves no room to generate within max_model_len={self.max_model_len}"
            )
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[len(self.prompt_token_ids):]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.is_finished else None

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
