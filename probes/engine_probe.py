"""Probes fed by the engine's observer interface (``LLMEngine.add_observer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from probes.base import Probe

if TYPE_CHECKING:
    from engine.observer import RequestEvent, StepStats


class EngineProbe(Probe):
    """A probe the engine calls on every step and request event; it implements ``EngineObserver``.

    NOTE: the callbacks run on the engine's thread inside ``step()``: they only append the
    engine's own ``StepStats`` / ``RequestEvent`` objects to the row deque (O(1), no lock); every
    conversion happens in ``flush()`` on the session's thread. That relies on the engine building
    a fresh object per call and never changing it afterwards.
    """

    def on_step(self, stats: StepStats) -> None:  # noqa: B027 - a probe listens to what it needs
        pass

    def on_request_event(self, event: RequestEvent) -> None:  # noqa: B027 - a probe listens to what it needs
        pass
