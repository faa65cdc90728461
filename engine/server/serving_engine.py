"""What the server needs from an engine, so the continuous engine and the baselines both fit."""

from __future__ import annotations

from typing import Protocol

from engine.config import EngineConfig
from engine.outputs import EngineStats, RequestOutput
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer


class ServingEngine(Protocol):
    """An engine driven by one thread: queue requests, step, abort, report its state.

    ``LLMEngine`` fits, and so do the ``naive`` and ``static`` baselines in ``engine.baselines``.
    NOTE: implementations need not be thread-safe; :class:`engine.server.async_engine.AsyncEngine`
    makes every call from its own engine thread.
    """

    config: EngineConfig
    tokenizer: Tokenizer
    model_name: str

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a request; raises ValueError for a prompt the engine cannot take."""
        ...

    def step(self) -> list[RequestOutput]:
        """Advance the running requests by one iteration; returns the outputs that changed."""
        ...

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its KV memory; False if it is unknown or already done."""
        ...

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        ...

    def stats(self) -> EngineStats:
        """A snapshot of the queues and the KV pool."""
        ...
