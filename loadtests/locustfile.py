"""Locust users for OpenAI-compatible LLM servers; run headless by ``servescope load`` / ``diagnose``.

``LLMUser`` is the closed loop: each user streams one request, and sends the next when it ends.
``OpenLoopUser`` is the open loop: one per worker process, it sends on a seeded arrival schedule
(Poisson, or gamma gaps for burstiness; ``loadtests.arrival``) from a greenlet per request, so a
slow server never slows the arrivals; run it with as many users as worker processes.
``TraceUser`` replays a trace the same way, each plan item once at its own ``arrival_s``.
``ChatSessionUser`` is a closed loop over chat sessions: turn after turn, each sending the whole
history (the user's messages and the server's own replies so far).

Both stream SSE and report, besides the HTTP row, TTFT, ITL and TPOT as their own Locust rows
(request type ``LLM``), and append a client row per request to the run directory.

How a run ends: users stop sending at the deadline (warm-up + duration) and finish what they have
in flight; when a worker's last user is done, the run quits itself (a worker tells the master,
which quits once every worker has). Locust's ``-t`` is only a safety bound past that.
NOTE: Locust's own quit after ``-t`` waits just 0.5 s for workers' last requests and its CSV
writer a second; the waits below let the final stats reach the master and the CSVs first.

Run by hand (a server on port 8000, a plan written by the orchestrator)::

    locust -f loadtests/locustfile.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000 \
        --ss-run-dir RUN --ss-model dummy:tiny LLMUser
"""

from __future__ import annotations

from typing import Any

import gevent
import gevent.pool
from locust import HttpUser, constant, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import STATE_RUNNING, STATE_SPAWNING, WORKER_REPORT_INTERVAL, MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC
from urllib3 import PoolManager

from loadtests.arrival import worker_rng
from loadtests.load_context import API_PATHS, LoadContext, send_request

# Connections an open-loop worker may hold at once (requests in flight beyond it get new ones).
MAX_OPEN_LOOP_CONNECTIONS = 1024
CONTEXT_ATTRIBUTE = "servescope_load"
# How far ahead of its time a trace request's greenlet is created (it then sleeps to the time).
TRACE_LOOKAHEAD_S = 0.5
WORKER_DONE_MESSAGE = "servescope_worker_done"
# Seconds to let a last stats report (worker -> master) or CSV write (master, local) happen.
REPORT_SETTLE_S = WORKER_REPORT_INTERVAL + 0.5
CSV_SETTLE_S = CSV_STATS_INTERVAL_SEC + 0.5


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    g = parser.add_argument_group("servescope")
    g.add_argument("--ss-run-dir", default=None, help="run directory: the plan is read from it, client rows go to it")
    g.add_argument("--ss-plan", default=None, help="request plan (default RUN_DIR/workload.jsonl)")
    g.add_argument("--ss-model", default="", help="the model name to put in requests")
    g.add_argument("--ss-api", default="completions", choices=sorted(API_PATHS))
    g.add_argument("--ss-warmup", type=float, default=0.0, help="seconds whose requests are flagged warm-up")
    g.add_argument("--ss-duration", type=float, default=60.0, help="seconds after the warm-up to send requests")
    g.add_argument("--ss-rate", type=float, default=0.0, help="open-loop requests/s over all workers (0: closed)")
    g.add_argument("--ss-burstiness", type=float, default=1.0, help="gamma shape of open-loop gaps (1: Poisson)")
    g.add_argument("--ss-burst-size", type=int, default=1, help="requests per open-loop arrival")
    g.add_argument("--ss-seed", type=int, default=0)
    g.add_argument("--ss-num-workers", type=int, default=1, help="worker processes in the run")
    g.add_argument("--ss-ignore-eos", type=int, default=1, help="1: ask for exactly max_tokens tokens")
    g.add_argument("--ss-read-timeout", type=float, default=300.0, help="seconds a stream may stay silent")
    g.add_argument("--ss-trace", type=int, default=0, help="1: send each plan item once, at its arrival_s")


@events.init.add_listener
def _on_init(environment: Environment, **_kwargs: Any) -> None:
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        done_workers: set[int] = set()

        def on_worker_done(environment: Environment, msg: Any, **_kwargs: Any) -> None:
            done_workers.add(int(msg.data["worker_index"]))
            if len(done_workers) == environment.parsed_options.ss_num_workers:
                gevent.spawn(_quit_after, environment, CSV_SETTLE_S)

        runner.register_message(WORKER_DONE_MESSAGE, on_worker_done)


def _quit_after(environment: Environment, delay_s: float) -> None:
    gevent.sleep(delay_s)
    if environment.runner is not None:
        environment.runner.quit()


def _tell_done_after(environment: Environment, worker_index: int, delay_s: float) -> None:
    gevent.sleep(delay_s)
    if environment.runner is not None:
        environment.runner.send_message(WORKER_DONE_MESSAGE, {"worker_index": worker_index})


def _user_done(environment: Environment) -> None:
    """A user stopped; the worker's last one ends the run (see the module docstring)."""
    context = getattr(environment, CONTEXT_ATTRIBUTE, None)
    runner = environment.runner
    if context is None or runner is None or not context.user_finished():
        return
    if runner.state not in (STATE_RUNNING, STATE_SPAWNING):
        return  # already stopping (Locust's -t bound)
    if isinstance(runner, WorkerRunner):
        gevent.spawn(_tell_done_after, environment, context.worker_index, REPORT_SETTLE_S)
    else:
        gevent.spawn(_quit_after, environment, CSV_SETTLE_S)


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kwargs: Any) -> None:
    if isinstance(environment.runner, MasterRunner):
        return  # the master only gathers stats; its workers send
    options = environment.parsed_options
    if options is None or options.ss_run_dir is None:
        raise ValueError("the servescope locustfile needs --ss-run-dir")
    worker_index = max(int(getattr(environment.runner, "worker_index", 0)), 0)
    setattr(environment, CONTEXT_ATTRIBUTE, LoadContext.from_options(options, worker_index))


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_kwargs: Any) -> None:
    context = getattr(environment, CONTEXT_ATTRIBUTE, None)
    if context is not None:
        context.close()


def load_context(environment: Environment) -> LoadContext:
    context = getattr(environment, CONTEXT_ATTRIBUTE, None)
    if context is None:
        raise RuntimeError("the run's context is missing: test_start did not run on this worker")
    return context


class LLMUser(HttpUser):
    """Closed loop: send, stream to the end, send the next; stops sending at the run's deadline."""

    wait_time = constant(0)

    def on_start(self) -> None:
        load_context(self.environment).user_started()

    def on_stop(self) -> None:
        _user_done(self.environment)

    @task
    def stream_one(self) -> None:
        context = load_context(self.environment)
        if context.arrivals is not None or context.is_trace:
            raise StopUser()  # an open-loop run uses OpenLoopUser, a trace TraceUser
        if context.clock.now() >= context.deadline:
            raise StopUser()
        send_request(self.client, context, self.environment.events.request.fire)


class ChatSessionUser(HttpUser):
    """Closed loop over chat sessions: each turn sends the history so far and waits for its reply."""

    wait_time = constant(0)

    def on_start(self) -> None:
        load_context(self.environment).user_started()

    def on_stop(self) -> None:
        _user_done(self.environment)

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


class OpenLoopUser(HttpUser):
    """Open loop: one per worker; each arrival of the seeded schedule goes out on its own greenlet."""

    wait_time = constant(0)

    def __init__(self, environment: Environment) -> None:
        # NOTE: before HttpUser.__init__, which hands it to the session: many requests in flight at once.
        self.pool_manager = PoolManager(maxsize=MAX_OPEN_LOOP_CONNECTIONS, block=False)
        super().__init__(environment)
        self._in_flight = gevent.pool.Group()
        self._next_arrival: float | None = None
        self._gaps: Any = None

    def on_start(self) -> None:
        context = load_context(self.environment)
        context.user_started()
        if context.arrivals is None:
            raise StopUser()  # a closed-loop run uses LLMUser
        self._gaps = context.arrivals.gaps(worker_rng(context.seed, context.worker_index))
        self._next_arrival = context.clock.now()

    @task
    def arrive(self) -> None:
        context = load_context(self.environment)
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
        _user_done(self.environment)


class TraceUser(HttpUser):
    """Trace replay: one per worker; each plan item goes out once, on its own greenlet, at its ``arrival_s``."""

    wait_time = constant(0)

    def __init__(self, environment: Environment) -> None:
        self.pool_manager = PoolManager(maxsize=MAX_OPEN_LOOP_CONNECTIONS, block=False)
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
        _user_done(self.environment)
