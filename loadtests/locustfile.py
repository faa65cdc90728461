"""Locust for OpenAI-compatible LLM servers: run by ``servescope load`` / ``diagnose``, or by plain Locust.

The user classes (:mod:`loadtests.client.users`): ``LLMUser`` (closed loop), ``OpenLoopUser`` (seeded
arrivals), ``TraceUser`` (trace replay), ``ChatSessionUser`` (multi-turn chat). Each streams SSE
and reports, besides the HTTP row, TTFT, ITL and TPOT as their own Locust rows (request type
``LLM``), and journals a client row per request. This file holds the ``--ss-*`` options and the
hooks that run a test: who builds the plan, where the rows go, how the run ends.

Where the rows go: a lone Locust process (``--processes 1``) appends them to the run directory
itself. A master's workers (``--processes N``, or ``servescope worker`` on other machines) get
the plan from the master and send their rows back to it, which appends them to the same files
(:mod:`loadtests.client.relay`, :mod:`loadtests.client.collector`); the worker needs nothing on its own disk.

How a run ends: users stop sending at the deadline (warm-up + duration) and finish what they have
in flight; when a worker's last user is done, the run quits itself (a worker tells the master,
which quits once every worker has, or was lost). Locust's ``-t`` is only a safety bound past that.
NOTE: Locust's own quit after ``-t`` waits just 0.5 s for workers' last requests and its CSV
writer a second; the waits below let the final stats reach the master and the CSVs first.

Plain Locust (no plan: :mod:`loadtests.run.plain_run` builds the default workload and writes a run
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
from locust import events
from locust.env import Environment
from locust.rpc import Message
from locust.runners import STATE_RUNNING, STATE_SPAWNING, WORKER_REPORT_INTERVAL, MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC

from loadtests.client import web_ui
from loadtests.client.collector import WorkerCollector
from loadtests.client.health import HealthSampler, health_path
from loadtests.client.load_context import API_PATHS, LoadContext, worker_name
from loadtests.client.point_control import CONTROL_MESSAGE, PointControl, read_control
from loadtests.client.point_control import POLL_S as CONTROL_POLL_S
from loadtests.client.records import Journal, LineFile, LineSink
from loadtests.client.relay import HEALTH, PLAN_MESSAGE, REQUESTS, RowRelay, decode_plan
from loadtests.client.users import CONTEXT_ATTRIBUTE, ChatSessionUser, LLMUser, OpenLoopUser, TraceUser
from loadtests.plan import PlannedRequest, read_plan
from loadtests.run.plain_run import PlainRuns
from loadtests.workloads.catalog import WORKLOADS
from probes.run_dir import PLAN_NAME

__all__ = ["ChatSessionUser", "LLMUser", "OpenLoopUser", "TraceUser"]  # NOTE: Locust finds its users here

logger = logging.getLogger(__name__)

PLAIN_ATTRIBUTE = "servescope_plain_runs"
WORKER_ATTRIBUTE = "servescope_worker_run"
COLLECTOR_ATTRIBUTE = "servescope_collector"
PLAN_ATTRIBUTE = "servescope_plan"
FORWARD_ATTRIBUTE = "servescope_control_forward"
# Seconds between a master's repeats of the current point control to its workers.
CONTROL_REPEAT_S = 1.0
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
    g.add_argument("--ss-controlled", type=int, default=0,
                   help="1: the run directory's point_control.json opens and ends the measured window (set by "
                        "servescope's stopping rule; --ss-warmup and --ss-duration are then its caps)")


def _has_plan(options: Any) -> bool:
    """Whether the orchestrator (or the user) gave a plan; without one this is a plain Locust run."""
    if options.ss_plan is not None:
        if not Path(options.ss_plan).is_file():
            raise ValueError(f"--ss-plan {options.ss_plan}: no such file")
        return True
    return options.ss_run_dir is not None and (Path(options.ss_run_dir) / PLAN_NAME).is_file()


def _plan_path(options: Any) -> Path:
    return Path(options.ss_plan) if options.ss_plan is not None else Path(options.ss_run_dir) / PLAN_NAME


@events.init.add_listener
def _on_init(environment: Environment, **_kwargs: Any) -> None:
    runner = environment.runner
    options = environment.parsed_options
    if isinstance(runner, WorkerRunner):
        # NOTE: a worker runs what its master dispatches, with the master's options and plan.
        def on_plan(environment: Environment, msg: Any, **_kwargs: Any) -> None:
            setattr(environment, PLAN_ATTRIBUTE, decode_plan(msg.data))

        def on_control(environment: Environment, msg: Any, **_kwargs: Any) -> None:
            context: LoadContext | None = getattr(environment, CONTEXT_ATTRIBUTE, None)
            if context is not None:
                context.apply(PointControl.from_dict(msg.data))

        runner.register_message(PLAN_MESSAGE, on_plan)
        runner.register_message(CONTROL_MESSAGE, on_control)
        return
    if options is None:
        return
    setattr(environment, PLAIN_ATTRIBUTE, None if _has_plan(options) else PlainRuns(options))
    web_ui.install(environment)
    if not options.user_classes:
        # NOTE: Locust runs every user class it finds unless some are named; one kind of loop at a time.
        environment.user_classes[:] = [OpenLoopUser if options.ss_rate > 0 else LLMUser]
    if isinstance(runner, MasterRunner):
        setattr(environment, COLLECTOR_ATTRIBUTE,
                WorkerCollector(environment, lambda: gevent.spawn(_quit_after, environment, CSV_SETTLE_S)))


def _quit_after(environment: Environment, delay_s: float) -> None:
    gevent.sleep(delay_s)
    if environment.runner is not None:
        environment.runner.quit()


def _tell_done_after(relay: RowRelay, delay_s: float) -> None:
    gevent.sleep(delay_s)
    relay.done(ended_itself=True)


def _load_ended(environment: Environment) -> None:
    """The worker's last user stopped at the deadline: end the run (see the module docstring)."""
    runner = environment.runner
    if runner is None or runner.state not in (STATE_RUNNING, STATE_SPAWNING):
        return  # already stopping (Locust's -t bound)
    worker: WorkerRun | None = getattr(environment, WORKER_ATTRIBUTE, None)
    if worker is not None and worker.relay is not None:
        gevent.spawn(_tell_done_after, worker.relay, REPORT_SETTLE_S)
    else:
        gevent.spawn(_quit_after, environment, CSV_SETTLE_S)


@dataclass(slots=True)
class WorkerRun:
    """What one process that sends (a lone Locust, or a master's worker) holds for one test."""

    context: LoadContext
    sampler: HealthSampler
    relay: RowRelay | None  # a master's worker: its lines go to the master
    control_watch: gevent.Greenlet | None = None  # a lone controlled process: follows point_control.json

    @classmethod
    def start(cls, environment: Environment) -> WorkerRun:
        runner, options = environment.runner, environment.parsed_options
        worker_index = max(int(getattr(runner, "worker_index", 0)), 0)
        worker = worker_name(worker_index)
        relay: RowRelay | None = None
        health: LineSink
        if isinstance(runner, WorkerRunner):
            plan: list[PlannedRequest] | None = getattr(environment, PLAN_ATTRIBUTE, None)
            if plan is None:
                raise RuntimeError("no plan came from the master before its users did")
            relay = RowRelay(runner.send_message, worker)
            journal, health = Journal(relay.lines(REQUESTS)), relay.lines(HEALTH)
        else:
            if options is None or options.ss_run_dir is None:
                raise ValueError("the servescope locustfile needs --ss-run-dir")
            plan = read_plan(_plan_path(options))
            journal = Journal.in_run_dir(options.ss_run_dir, worker)
            health = LineFile(health_path(options.ss_run_dir, worker))
        context = LoadContext.from_options(options, worker_index, plan, journal)
        context.on_load_ended = lambda: _load_ended(environment)
        if relay is not None:
            relay.count_started = lambda: context.num_started
            relay.start()
        sampler = HealthSampler(health, worker, context.clock, progress=context.progress)
        sampler.start()
        control_watch = None
        if context.is_controlled and relay is None:
            control_watch = gevent.spawn(_follow_control, options.ss_run_dir, context.apply)
        return cls(context, sampler, relay, control_watch)

    def stop(self) -> None:
        """Close the journals; a worker sends its last lines and says every row is sent."""
        if self.control_watch is not None:
            self.control_watch.kill()
        self.sampler.stop()
        self.context.close()
        if self.relay is not None:
            self.relay.close()
            if not self.relay.is_done:
                self.relay.done(ended_itself=False)


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
        # NOTE: the master only gathers; the plan goes out before Locust's spawn messages.
        collector: WorkerCollector = getattr(environment, COLLECTOR_ATTRIBUTE)
        collector.begin(_plan_path(environment.parsed_options))
        options = environment.parsed_options
        if options.ss_controlled:
            previous_forward: gevent.Greenlet | None = getattr(environment, FORWARD_ATTRIBUTE, None)
            if previous_forward is not None:
                previous_forward.kill()
            setattr(environment, FORWARD_ATTRIBUTE, gevent.spawn(
                _follow_control, options.ss_run_dir,
                lambda control: runner.send_message(CONTROL_MESSAGE, control.to_dict()), CONTROL_REPEAT_S))
        return
    previous: WorkerRun | None = getattr(environment, WORKER_ATTRIBUTE, None)
    if previous is not None:
        previous.stop()  # a web-UI run started again without a stop between
    setattr(environment, WORKER_ATTRIBUTE, WorkerRun.start(environment))
    setattr(environment, CONTEXT_ATTRIBUTE, getattr(environment, WORKER_ATTRIBUTE).context)


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_kwargs: Any) -> None:
    forward: gevent.Greenlet | None = getattr(environment, FORWARD_ATTRIBUTE, None)
    if forward is not None:
        forward.kill()
        setattr(environment, FORWARD_ATTRIBUTE, None)
    worker: WorkerRun | None = getattr(environment, WORKER_ATTRIBUTE, None)
    if worker is not None:
        worker.stop()
        setattr(environment, WORKER_ATTRIBUTE, None)
    runner = environment.runner
    collector: WorkerCollector | None = getattr(environment, COLLECTOR_ATTRIBUTE, None)
    plain: PlainRuns | None = getattr(environment, PLAIN_ATTRIBUTE, None)
    if plain is None or plain.current is None:
        if collector is not None:
            collector.end()
        return
    plain.current.note_stopped()
    if isinstance(runner, MasterRunner):
        _stop_workers(runner, environment.stop_timeout or 0.0)
        gevent.sleep(REPORT_SETTLE_S)  # the workers' last stats reports (and their last rows)
    elif getattr(environment.parsed_options, "csv_prefix", None):
        gevent.sleep(CSV_SETTLE_S)  # Locust's --csv writer (once a second) takes in the last requests
    if collector is not None:
        collector.end()
    _finish_plain_run(environment)


def _follow_control(run_dir: str, on_change: Callable[[PointControl], None], repeat_s: float | None = None) -> None:
    """Poll ``run_dir``'s point_control.json and pass on each new version, and the current one again every
    ``repeat_s`` (a master's workers: one whose test started late still gets it); runs until killed."""
    last: PointControl | None = None
    passed_at = 0.0
    while True:
        control = read_control(run_dir)
        now = time.monotonic()
        if control is not None and (control != last or (repeat_s is not None and now - passed_at >= repeat_s)):
            on_change(control)
            last, passed_at = control, now
        gevent.sleep(CONTROL_POLL_S)


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


