"""One request's outputs, handed from the engine thread to the event loop through its own queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.outputs import RequestOutput


class EngineUnavailableError(RuntimeError):
    """The engine is shutting down or its thread is gone; the request was not (fully) served."""


class RequestFailedError(RuntimeError):
    """The engine failed while running this request (an exception in a step)."""


StreamItem = RequestOutput | EngineUnavailableError | RequestFailedError


class RequestStream:
    """Async iterator over a request's outputs, ending after the one with ``finished=True``.

    Raises the error the engine thread put on the queue instead of an output. ``cancel()``
    aborts the request in the engine (freeing its KV blocks) unless it already finished.
    NOTE: only the event loop touches a stream; the engine thread only schedules ``put`` on it.
    """

    def __init__(self, request_id: str, abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._abort = abort
        self._queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self.finished = False

    def put(self, item: StreamItem) -> None:
        """Called on the event loop (via ``call_soon_threadsafe``) for every item the engine produces."""
        self._queue.put_nowait(item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, Exception):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def cancel(self) -> None:
        """Abort the request if it is still going (a client went away); safe to call twice."""
        if not self.finished:
            self.finished = True
            self._abort(self.request_id)
