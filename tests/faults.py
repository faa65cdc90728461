"""Test-only fault injection: make the model runner raise for batches holding chosen requests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from engine import LLMEngine
from engine.request import Request
from engine.scheduler import SchedulerOutput

INJECTED = "injected: this request breaks the forward"


@contextmanager
def poisoned_forward(engine: LLMEngine, is_poisoned: Callable[[Request], bool]) -> Iterator[list[int]]:
    """While open, any forward whose batch holds a poisoned request raises; yields the failed batch sizes."""
    original = engine.runner.execute
    failed_batch_sizes: list[int] = []

    def execute(out: SchedulerOutput) -> object:
        if any(is_poisoned(item.request) for item in out.scheduled):
            failed_batch_sizes.append(len(out.scheduled))
            raise RuntimeError(INJECTED)
        return original(out)

    engine.runner.execute = execute  # type: ignore[method-assign]
    try:
        yield failed_batch_sizes
    finally:
        engine.runner.execute = original  # type: ignore[method-assign]
