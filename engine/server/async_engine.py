"""Runs a (thread-unsafe) engine on its own thread and streams each request's outputs to asyncio.

The event loop never calls the engine: it posts commands (add, abort) to an inbox under a lock and
wakes the engine thread; the engine thread applies them between steps and hands every output to
its request's :class:`RequestStream` with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.outputs import EngineStats
from engine.sampling_params import SamplingParams
from engine.server.engine_thread import EngineThread
from engine.server.metrics import RequestTimer, ServerMetrics
from engine.server.request_stream import (
    EngineUnavailableError,
    RequestFailedError,
    RequestStream,
    StreamItem,
)
from engine.server.serving_engine import ServingEngine

logger = logging.getLogger(__name__)

DEFAULT_MAX_WAITING = 256
# How long the engine thread rests when a step made no progress, so a stuck engine cannot spin.
STALL_WAIT_S = 0.01


class QueueFullError(RuntimeError):
    """Too many requests are waiting to run; the client should retry after ``retry_after_s``."""

    def __init__(self, num_waiting: int, max_waiting: int, retry_after_s: int = 1) -> None:
        super().__init__(f"the server is busy: {num_waiting} requests are already waiting (limit {max_waiting}); "
                         f"retry later")
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float  # time.time(), for the engine's observers
    arrival_monotonic: float  # time.monotonic(), for the latency histograms
    stream: RequestStream
    admitted: asyncio.Future[None]


@dataclass(slots=True)
class _Abort:
    request_id: str


# How an add's ``admitted`` future settles: with None (taken) or the engine's error.
_Settlement = tuple[asyncio.Future[None], Exception | None]


@dataclass(slots=True)
class _Tracked:
    stream: RequestStream
    timer: RequestTimer


class AsyncEngine:
    """The server's view of an engine: ``await generate(...)`` gives a stream of outputs.

    ``max_waiting`` bounds requests admitted but not yet running (queued here or waiting in the
    engine); past it :meth:`generate` raises :class:`QueueFullError`. Pass the ``engine_thread``
    that built the engine so that it also steps it (see :mod:`engine.server.engine_thread`);
    without one, a new thread steps it.
    """

    def __init__(self, engine: ServingEngine, max_waiting: int = DEFAULT_MAX_WAITING,
                 engine_thread: EngineThread | None = None) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = ServerMetrics(engine.model_name, self.stats)
        self._cond = threading.Condition()
        self._inbox: deque[_Add | _Abort] = deque()
        self._num_inbox_adds = 0
        self._stopping = False
        self._snapshot = engine.stats()
        # NOTE: _streams and _has_work belong to the engine thread alone; the lock guards the
        # inbox, _num_inbox_adds, _stopping and _snapshot.
        self._streams: dict[str, _Tracked] = {}
        self._has_work = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine_thread = engine_thread
        self._thread: threading.Thread | None = None

    # -- lifecycle (event loop) -------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread; call from the event loop that will consume the streams."""
        if self._thread is not None:
            raise RuntimeError("the engine thread is already started")
        self._loop = asyncio.get_running_loop()
        if self._engine_thread is not None:
            self._thread = self._engine_thread.run_loop(self._run)
            return
        self._thread = threading.Thread(target=self._run, name="servescope-engine", daemon=True)
        self._thread.start()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Abort whatever is still in flight and join the engine thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout_s)

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def stats(self) -> EngineStats:
        """The engine's stats as of its last step or command (safe from any thread)."""
        return self._snapshot

    # -- requests (event loop) --------------------------------------------------------------------
    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str) -> RequestStream:
        """Queue a request; returns once the engine has taken it.

        Raises ValueError when the engine rejects the prompt, QueueFullError when too many
        requests wait, EngineUnavailableError when the engine is stopping or gone.
        """
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_id, self.abort)
        admitted: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if not self.is_alive:
                raise EngineUnavailableError("the engine is not running (the server is shutting down)")
            num_waiting = self._num_inbox_adds + self._snapshot.num_waiting
            if num_waiting >= self.max_waiting:
                raise QueueFullError(num_waiting, self.max_waiting)
            self._inbox.append(_Add(request_id, prompt_token_ids, params, time.time(), time.monotonic(),
                                    stream, admitted))
            self._num_inbox_adds += 1
            self._cond.notify()
        try:
            await admitted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Ask the engine thread to abort a request (no-op if it already finished)."""
        with self._cond:
            self._inbox.append(_Abort(request_id))
            self._cond.notify()

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._serve_once():
                pass
        except BaseException:
            logger.exception("the engine thread died")
            raise
        finally:
            self._shut_down()

    def _serve_once(self) -> bool:
        """Apply pending commands, then run one step if there is work; False once stopping."""
        with self._cond:
            while not (self._inbox or self._has_work or self._stopping):
                self._cond.wait()
            if self._stopping:
                return False
            commands = list(self._inbox)
            self._inbox.clear()
            self._num_inbox_adds = 0
            settlements = [self._apply(command) for command in commands]
            self._publish()
        # NOTE: admissions are announced only after the snapshot counts them, so a client that
        # sees its stream start also sees it in stats().
        self._settle_all([settlement for settlement in settlements if settlement is not None])
        if not self._has_work:
            return True
        steps_before = self._snapshot.num_steps
        deliveries = self._step()
        with self._cond:
            self._publish()
        # NOTE: outputs go out only after the snapshot counts the step, so a client that sees its first
        # token also sees its request running in stats() (and a request sent then is not refused as
        # if the first still waited).
        self._deliver(deliveries)
        with self._cond:
            if self._has_work and self._snapshot.num_steps == steps_before and not self._inbox:
                self._cond.wait(STALL_WAIT_S)
        return True

    def _apply(self, command: _Add | _Abort) -> _Settlement | None:
        """Run one command on the engine; an add returns how its ``admitted`` future must settle."""
        if isinstance(command, _Abort):
            if self._streams.pop(command.request_id, None) is not None:
                self._engine_abort(command.request_id)
            return None
        try:
            self.engine.add_request(command.prompt_token_ids, command.params, command.request_id,
                                    arrival_time=command.arrival_time)
        except Exception as exc:  # ValueError for bad prompts; anything else is the engine's fault
            if not isinstance(exc, ValueError):
                logger.exception("add_request failed for %s", command.request_id)
            return command.admitted, exc
        timer = self.metrics.timer(command.arrival_monotonic)
        self._streams[command.request_id] = _Tracked(command.stream, timer)
        return command.admitted, None

    def _step(self) -> list[tuple[RequestStream, StreamItem]]:
        """One engine step; returns what each stream gets from it (delivered once the snapshot is published)."""
        try:
            outputs = self.engine.step()
        except Exception as exc:
            # NOTE: after a failed step the engine's state for the batch is unknown, so every
            # request in flight is aborted (freeing its blocks) and failed; new requests still run.
            logger.exception("engine step failed; failing %d in-flight requests", len(self._streams))
            self._fail_all(RequestFailedError(f"the engine failed while running this request: {exc!r}"))
            return []
        now = time.monotonic()
        deliveries: list[tuple[RequestStream, StreamItem]] = []
        for output in outputs:
            tracked = self._streams.get(output.request_id)
            if tracked is None:
                continue  # aborted after the step was scheduled
            tracked.timer.on_output(now, output)
            if output.error is not None:  # the engine failed this request alone; the batch went on
                deliveries.append((tracked.stream, RequestFailedError(
                    f"the engine failed while running this request: {output.error}")))
            else:
                deliveries.append((tracked.stream, output))
            if output.finished:
                del self._streams[output.request_id]
        return deliveries

    def _publish(self) -> None:
        self._snapshot = self.engine.stats()
        self._has_work = self.engine.has_unfinished()

    def _fail_all(self, error: EngineUnavailableError | RequestFailedError) -> None:
        failed = list(self._streams.items())
        self._streams.clear()
        for request_id, _ in failed:
            self._engine_abort(request_id)
        self._deliver([(tracked.stream, error) for _, tracked in failed])

    def _shut_down(self) -> None:
        """On the engine thread's way out: refuse queued adds, abort and fail running requests."""
        with self._cond:
            self._stopping = True
            commands = list(self._inbox)
            self._inbox.clear()
            self._num_inbox_adds = 0
        error = EngineUnavailableError("the server is shutting down")
        self._settle_all([(command.admitted, error) for command in commands if isinstance(command, _Add)])
        self._fail_all(error)
        try:
            self._publish()
        except Exception:
            logger.exception("engine stats failed during shutdown")

    def _engine_abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:
            logger.exception("aborting %s failed", request_id)

    def _deliver(self, deliveries: list[tuple[RequestStream, StreamItem]]) -> None:
        if deliveries:
            self._call_soon(_put_all, deliveries)

    def _settle_all(self, settlements: list[_Settlement]) -> None:
        if settlements:
            self._call_soon(_settle, settlements)

    def _call_soon(self, callback: Callable[..., None], *args: object) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)


def _put_all(deliveries: list[tuple[RequestStream, StreamItem]]) -> None:
    for stream, item in deliveries:
        stream.put(item)


def _settle(settlements: list[_Settlement]) -> None:
    for future, error in settlements:
        if future.done():  # the client gave up while the engine was taking the request
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
