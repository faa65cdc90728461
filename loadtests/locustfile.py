"""Locust users for OpenAI-compatible LLM servers: run by ``servescope load`` / ``diagnose``, or by plain Locust.

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

Plain Locust (no plan: :mod:`loadtests.plain_run` builds the default workload and writes a run
directory, ``runs/locust-<timestamp>`` or ``--ss-run-dir``; closed-loop ``LLMUser`` unless
``--ss-rate R`` or ``OpenLoopUser`` is given; users send until Locust stops them)::

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000            # web UI at :8089
    locust -f loadtests/locustfile.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000

With a plan the orchestrator wrote (``RUN/workload.jsonl``), the run follows its flags::

    locust -f loadtests/locustfile.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:8000 \
        --ss-run-dir RUN --ss-model dummy:tiny --ss-duration 20 LLMUser
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gevent
import gevent.pool
from locust import HttpUser, constant, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.rpc import Message
from locust.runners import STATE_RUNNING, STATE_SPAWNING, WORKER_REPORT_INTERVAL, MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC
from urllib3 import PoolManager

from loadtests import web_ui
from loadtests.arrival import worker_rng
from loadtests.client_health import HealthSampler
from loadtests.load_context import API_PATHS, LoadContext, send_request
from loadtests.plain_run import PlainRuns
from loadtests.workloads import WORKLOADS
from probes.run_dir import PLAN_NAME

logger = logging.getLogger(__name__)

# Connections an open-loop worker may hold at once (requests in flight beyond it get new ones).
MAX_OPEN_LOOP_CONNECTIONS = 1024
CONTEXT_ATTRIBUTE = "servescope_load"
PLAIN_ATTRIBUTE = "servescope_plain_runs"
HEALTH_ATTRIBUTE = "servescope_health"
# How far ahead of its time a trace request's greenlet is created (it then sleeps to the time).
TRACE_LOOKAHEAD_S = 0.5
WORKER_DONE_MESSAGE = "servescope_worker_done"
# Seconds to let a last stats report (worker -> master) or CSV write (master, local) happen.
REPORT_SETTLE_S = WORKER_REPORT_INTERVAL + 0.5
CSV_SETTLE_S = CSV_STATS_INTERVAL_SEC + 0.5
# Seconds a master gives its workers to stop their users (past the stop timeout), as Locust's own stop does.
WORKER_STOP_ALLOWANCE_S = 60.0


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    # NOTE: options of a group stay out of the web UI's start form. Locust prints --help before it
    # loads a locustfile (locustio/locust#2917), so --ss-help prints the same help once it has.
    g = parser.add_argument_group(
        "servescope", "LLM load (TTFT, ITL, TPOT and output tokens/s rows, type LLM). Without a plan, a run "
                      "directory of the default workload is written; `servescope report DIR` reports on it.")
    g.add_argument("--ss-help", action="help",
                   help="show this help, these --ss-* options included, and exit (Locust's --help omits them)")
    g.add_argument("--ss-run-dir", default=None,
                   help="run directory: the plan is read from it if it holds one, else written to it with the "
                        "client rows and report (default runs/locust-<timestamp>)")
    g.add_argument("--ss-plan", default=None,
                   help="request plan to send (default RUN_DIR/workload.jsonl)")
    g.add_argument("--ss-model", default="", help="model name to request (default: the first the target's "
                                                  "/v1/models lists)")
    g.add_argument("--ss-tokenizer", default=None, help="without a plan: tokenizer to cut prompts with, a "
                   "`servescope --model` name (default: the served model's when known, else smollm2-135m)")
    g.add_argument("--ss-workload", choices=sorted(WORKLOADS), default="sharegpt-synth",
                   help="without a plan: the workload to build it from (default %(default)s)")
    g.add_argument("--ss-max-tokens", type=int, default=None,
                   help="without a plan: cap on output tokens per request (default: the workload's own)")
    g.add_argument("--ss-api", default="completions", choices=sorted(API_PATHS),
                   help="endpoint to load (default %(default)s)")
    g.add_argument("--ss-warmup", type=float, default=0.0, help="seconds whose requests are flagged warm-up "
                                                                "and left out of the statistics")
    g.add_argument("--ss-duration", type=float, default=None,
                   help="seconds after the warm-up to send requests, then the run ends itself "
                        "(default: until Locust stops it: -t, Ctrl-C or the web UI)")
    g.add_argument("--ss-rate", type=float, default=0.0,
                   help="open loop (OpenLoopUser, one per worker process): requests/s over all workers "
                        "(default 0: closed-loop LLMUser)")
    g.add_argument("--ss-burstiness", type=float, default=1.0, help="gamma shape of open-loop gaps (1: Poisson)")
    g.add_argument("--ss-burst-size", type=int, default=None, help="requests per open-loop arrival (default 1, "
                                                                   "8 for the burst workload)")
    g.add_argument("--ss-seed", type=int, default=0, help="seeds the workload and the arrivals")
    g.add_argument("--ss-num-workers", type=int, default=1, help="worker processes in the run (set by itself "
                                                                 "without a plan)")
    g.add_argument("--ss-ignore-eos", type=int, default=1, help="1: ask for exactly max_tokens tokens")
    g.add_argument("--ss-read-timeout", type=float, default=300.0, help="seconds a stream may stay silent")
    g.add_argument("--ss-trace", type=int, default=0, help="1: send each plan item once, at its arrival_s")


def _has_plan(options: Any) -> bool:
    """Whether the orchestrator (or the user) gave a plan; without one this is a plain Locust run."""
    if options.ss_plan is not None:
        if not Path(options.ss_plan).is_file():
            raise ValueError(f"--ss-plan {options.ss_plan}: no such file")
        return True
    return options.ss_run_dir is not None and (Path(options.ss_run_dir) / PLAN_NAME).is_file()


@events.init.add_listener
def _on_init(environment: Environment, **_kwargs: Any) -> None:
    runner = environment.runner
    options = environment.parsed_options
    if isinstance(runner, WorkerRunner) or options is None:
        return  # a worker runs what its master dispatches, with the master's options
    setattr(environment, PLAIN_ATTRIBUTE, None if _has_plan(options) else PlainRuns(options))
    web_ui.install(environment)
    if not options.user_classes:
        # NOTE: Locust runs every user class it finds unless some are named; one kind of loop at a time.
        environment.user_classes[:] = [OpenLoopUser if options.ss_rate > 0 else LLMUser]
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
    if context is None or runner is None or not context.user_finished() or not context.ends_itself:
        return  # NOTE: in a plain run users stop when Locust (or the web UI) says so, not at a deadline
    if runner.state not in (STATE_RUNNING, STATE_SPAWNING):
        return  # already stopping (Locust's -t bound)
    if isinstance(runner, WorkerRunner):
        gevent.spawn(_tell_done_after, environment, context.worker_index, REPORT_SETTLE_S)
    else:
        gevent.spawn(_quit_after, environment, CSV_SETTLE_S)


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kwargs: Any) -> None:
    runner = environment.runner
    plain: PlainRuns | None = getattr(environment, PLAIN_ATTRIBUTE, None)
    if plain is not None:
        num_workers = runner.worker_count if isinstance(runner, MasterRunner) else 1
        try:
            plain.start(environment, num_workers)
        except Exception as exc:  # noqa: BLE001 - a run that cannot start says why and stops
            logger.error("servescope: cannot start the run: %s", exc)
            environment.process_exit_code = 1
            assert runner is not None
            gevent.spawn(runner.quit if environment.parsed_options.headless else runner.stop)
            return
    if isinstance(runner, MasterRunner):
        return  # the master only gathers stats; its workers send
    options = environment.parsed_options
    if options is None or options.ss_run_dir is None:
        raise ValueError("the servescope locustfile needs --ss-run-dir")
    worker_index = max(int(getattr(runner, "worker_index", 0)), 0)
    context = LoadContext.from_options(options, worker_index)
    setattr(environment, CONTEXT_ATTRIBUTE, context)
    previous: HealthSampler | None = getattr(environment, HEALTH_ATTRIBUTE, None)
    if previous is not None:
        previous.stop()  # a web-UI run started again without a stop between
    sampler = HealthSampler(context.run_dir, context.worker, context.clock)
    sampler.start()
    setattr(environment, HEALTH_ATTRIBUTE, sampler)


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_kwargs: Any) -> None:
    context = getattr(environment, CONTEXT_ATTRIBUTE, None)
    if context is not None:
        context.close()
    sampler: HealthSampler | None = getattr(environment, HEALTH_ATTRIBUTE, None)
    if sampler is not None:
        sampler.stop()
    plain: PlainRuns | None = getattr(environment, PLAIN_ATTRIBUTE, None)
    if plain is None or plain.current is None:
        return
    plain.current.note_stopped()
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        _stop_workers(runner, environment.stop_timeout or 0.0)
        gevent.sleep(REPORT_SETTLE_S)  # the workers' last stats reports
    elif getattr(environment.parsed_options, "csv_prefix", None):
        gevent.sleep(CSV_SETTLE_S)  # Locust's --csv writer (once a second) takes in the last requests
    _finish_plain_run(environment)


def _stop_workers(runner: MasterRunner, stop_timeout_s: float) -> None:
    """Have the workers stop their users (and close their journals) before a plain run is written.

    NOTE: a master stopping from the web UI has done so already; one quitting (-t, Ctrl-C) stops
    before its workers, which Locust then tells to quit, too late for the run directory.
    """
    if runner.user_count == 0:
        return
    for client in runner.clients.all:
        runner.server.send_to_client(Message("stop", None, client.id))
    with gevent.Timeout(stop_timeout_s + WORKER_STOP_ALLOWANCE_S, False):
        while runner.user_count != 0:
            gevent.sleep(0.2)


def _finish_plain_run(environment: Environment) -> None:
    plain: PlainRuns | None = getattr(environment, PLAIN_ATTRIBUTE, None)
    if plain is not None:
        try:
            plain.finish(environment)
        except Exception:  # noqa: BLE001 - Locust must still write its own stats and exit
            logger.exception("servescope: writing the plain run's directory failed")


def load_context(environment: Environment) -> LoadContext:
    context = getattr(environment, CONTEXT_ATTRIBUTE, None)
    if context is None:
        raise RuntimeError("the run's context is missing: test_start did not run on this worker")
    return context


class ClosedLoopUser(HttpUser):
    """What every closed-loop user shares: no wait between requests, counted in and out of the run."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        load_context(self.environment).user_started()

    def on_stop(self) -> None:
        _user_done(self.environment)


class LLMUser(ClosedLoopUser):
    """Closed loop: send, stream to the end, send the next; stops sending at the run's deadline."""

    @task
    def stream_one(self) -> None:
        context = load_context(self.environment)
        if context.arrivals is not None or context.is_trace:
            raise StopUser()  # an open-loop run uses OpenLoopUser, a trace TraceUser
        if context.clock.now() >= context.deadline:
            raise StopUser()
        send_request(self.client, context, self.environment.events.request.fire)


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
