"""The load loops: Locust user classes, one per way of sending (see :mod:`loadtests.locustfile`).

``LLMUser`` is the closed loop: each user streams one request, and sends the next when it ends.
``OpenLoopUser`` is the open loop: one per worker process, it sends on a seeded arrival schedule
(Poisson, or gamma gaps for burstiness; ``loadtests.workloads.arrival``) from a greenlet per request, so a
slow server never slows the arrivals; run it with as many users as worker processes.
``TraceUser`` replays a trace the same way, each plan item once at its own ``arrival_s``.
``ChatSessionUser`` is a closed loop over chat sessions: turn after turn, each sending the whole
history (the user's messages and the server's own replies so far).

Every user reads the run from the worker's :class:`~loadtests.client.load_context.LoadContext` (built at
``test_start``), stops sending at its deadline, and, the worker's last one, calls the context's
``on_load_ended`` (how a run ends itself is the locustfile's business). Each sends through its own
:class:`~loadtests.client.stream_client.StreamClient` (``self.client``), which reports to Locust through
:func:`~loadtests.client.load_context.send_request`.
"""

from __future__ import annotations

import logging
from typing import Any

import gevent
import gevent.pool
from locust import User, constant, task
from locust.env import Environment
from locust.exception import StopTest, StopUser

from loadtests.client.load_context import LoadContext, send_request
from loadtests.client.stream_client import StreamClient
from loadtests.workloads.arrival import worker_rng

logger = logging.getLogger(__name__)

CONTEXT_ATTRIBUTE = "servescope_load"
# How far ahead of its time a trace request's greenlet is created (it then sleeps to the time).
TRACE_LOOKAHEAD_S = 0.5


def load_context(environment: Environment) -> LoadContext:
    context = getattr(environment, CONTEXT_ATTRIBUTE, None)
    if context is None:
        raise RuntimeError("the run's context is missing: test_start did not run on this worker")
    return context


def _user_done(environment: Environment) -> None:
    """A user stopped; the worker's last one ends its load when the run ends itself."""
    context = getattr(environment, CONTEXT_ATTRIBUTE, None)
    if context is None or not context.user_finished() or not context.ends_itself:
        return  # NOTE: in a plain run users stop when Locust (or the web UI) says so, not at a deadline
    context.on_load_ended()


class StreamingUser(User):
    """A user with its own connections to the target (``--host``)."""

    abstract = True

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        if not self.host:
            raise StopTest("no target: pass --host (the server's URL)")
        self.client = StreamClient(self.host)

    def on_stop(self) -> None:
        self.client.close()


class ClosedLoopUser(StreamingUser):
    """What every closed-loop user shares: no wait between requests, counted in and out of the run."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        load_context(self.environment).user_started()

    def on_stop(self) -> None:
        super().on_stop()
        _user_done(self.environment)


class LLMUser(ClosedLoopUser):
    """Closed loop: send, stream to the end, send the next; stops sending at the run's deadline."""

    has_sent = False

    @task
    def stream_one(self) -> None:
        context = load_context(self.environment)
        if context.arrivals is not None or context.is_trace:
            raise StopUser()  # an open-loop run uses OpenLoopUser, a trace TraceUser
        if context.clock.now() >= context.deadline:
            raise StopUser()
        share = None if self.has_sent else context.first_share()
        self.has_sent = True
        send_request(self.client, context, self.environment.events.request.fire, output_share=share)


class ChatSessionUser(ClosedLoopUser):
    """Closed loop over chat sessions: each turn sends the history so far and waits for its reply."""

    @task
    def converse(self) -> None:
        context = load_context(self.environment)
        messages: list[dict[str, str]] = []
        for seq, item in context.next_session():
            if context.clock.now() >= context.deadline:
                raise StopUser()
            messages.append({"role": "user", "content": item.prompt})
            reply = send_request(self.client, context, self.environment.events.request.fire, None, (seq, item),
                                 list(messages))
            if reply is None:
                return  # a failed turn ends its session; the next task starts a new one
            messages.append({"role": "assistant", "content": reply})


class OpenLoopUser(StreamingUser):
    """Open loop: one per worker; each arrival of the seeded schedule goes out on its own greenlet."""

    wait_time = constant(0)

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self._in_flight = gevent.pool.Group()
        self._next_arrival: float | None = None
        self._gaps: Any = None

    def on_start(self) -> None:
        context = load_context(self.environment)
        context.user_started()
        if context.arrivals is None:
            return  # a closed-loop run uses LLMUser: this one stops at its first task
        if context.num_active_users > 1:
            # NOTE: each worker's one OpenLoopUser sends that worker's whole share of the rate.
            logger.warning("servescope: one OpenLoopUser per worker process sends at --ss-rate; the others stop")
            return
        self._gaps = context.arrivals.gaps(worker_rng(context.seed, context.worker_index))
        self._next_arrival = context.clock.now()

    @task
    def arrive(self) -> None:
        context = load_context(self.environment)
        if self._gaps is None:
            raise StopUser()  # not this worker's sender (see on_start)
        assert context.arrivals is not None and self._next_arrival is not None
        self._next_arrival += next(self._gaps)
        # NOTE: no arrival after the deadline, but the run still lasts until it: the user waits there.
        gevent.sleep(max(min(self._next_arrival, context.deadline) - context.clock.now(), 0.0))
        if self._next_arrival >= context.deadline:
            self._in_flight.join()
            raise StopUser()
        # NOTE: a late scheduler sends at once rather than skipping: the schedule is kept, and the
        # lag shows as send_time - scheduled_time in the client rows.
        for _ in range(context.arrivals.burst_size):
            self._in_flight.spawn(send_request, self.client, context, self.environment.events.request.fire,
                                  self._next_arrival)

    def on_stop(self) -> None:
        context = getattr(self.environment, CONTEXT_ATTRIBUTE, None)
        self._in_flight.join(timeout=context.stop_timeout_s if context else None)
        super().on_stop()
        _user_done(self.environment)


class TraceUser(StreamingUser):
    """Trace replay: one per worker; each plan item goes out once, on its own greenlet, at its ``arrival_s``."""

    wait_time = constant(0)

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self._in_flight = gevent.pool.Group()

    def on_start(self) -> None:
        context = load_context(self.environment)
        context.user_started()
        if not context.is_trace:
            raise StopUser()

    @task
    def replay(self) -> None:
        context = load_context(self.environment)
        for _ in range(context.num_trace_items):
            seq, item = context.next_item()
            assert item.arrival_s is not None, "a trace plan gives every item its arrival time"
            scheduled = context.start_time + item.arrival_s
            if scheduled >= context.deadline:
                break
            # NOTE: each request's greenlet is armed a little ahead and sleeps to its own time, so
            # it sends the moment its timer fires, not one scheduling hop later; a late one sends
            # at once, and its lag shows as send_time - scheduled_time in the client rows.
            gevent.sleep(max(scheduled - TRACE_LOOKAHEAD_S - context.clock.now(), 0.0))
            self._in_flight.add(gevent.spawn_later(
                max(scheduled - context.clock.now(), 0.0), send_request, self.client, context,
                self.environment.events.request.fire, scheduled, (seq, item)))
        self._in_flight.join()
        raise StopUser()

    def on_stop(self) -> None:
        context = getattr(self.environment, CONTEXT_ATTRIBUTE, None)
        self._in_flight.join(timeout=context.stop_timeout_s if context else None)
        super().on_stop()
        _user_done(self.environment)
