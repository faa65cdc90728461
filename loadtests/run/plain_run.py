"""A run started by plain Locust (``locust -f loadtests/locustfile.py --host URL``), without a plan.

The master (or the local runner) does here what ``servescope load`` does before and after its
Locust run: at ``test_start`` it asks the target for its model (``/v1/models``), builds the plan
of the default workload with the tokenizer ``servescope load`` would pick, starts the host and
``/metrics`` probes (in their own process, :mod:`loadtests.run.probe_process`), and writes
``load.json`` and ``workload.jsonl`` into a new run directory;
the master then sends that plan to its workers as in an orchestrated run (:mod:`loadtests.client.relay`). While the test runs, the user count is sampled, so changes
made from the web UI show as steps (``load.json``'s ``users_timeline``). When the test stops, the
client rows are merged and Locust's stats, the summary and the report are written, as
``servescope load`` writes them; ``servescope report DIR`` rewrites the report.

NOTE: Locust's workers import this module with the locustfile; what only the master needs
(pandas, pyarrow, the tokenizer, the probes) is imported where it is used.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent

from loadtests.client.load_context import API_KEY_ENV
from loadtests.config import LoadConfig
from loadtests.plan import build_plan, write_plan
from probes.run_dir import LOAD_NAME, LOCUST_STATS_NAME, PLAN_NAME, RUNS_DIR, LoadInfo, RunDirectory

if TYPE_CHECKING:
    from locust.env import Environment

    from loadtests.run.probe_process import ProbeProcess
    from loadtests.run.target import Target

logger = logging.getLogger(__name__)

# Seconds between samples of the user count (the steps in the report's timeline).
USER_SAMPLE_INTERVAL_S = 0.5
# The plan's size assumes this much load when neither -t nor --ss-duration says how long the run is
# (the workers cycle through the plan, so it bounds only the file, never the run).
DEFAULT_PLAN_SECONDS = 60.0


def default_run_dir() -> Path:
    return RUNS_DIR / f"locust-{time.strftime('%Y%m%d-%H%M%S')}"


def fresh_run_dir(base: Path) -> Path:
    """``base`` when it is new or empty, else the first of ``base-2``, ``base-3``, ... that is (one per test)."""
    candidate, n = base, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


# The --ss-* options whose default is None, and their types: a POST to /swarm may set any option, as text.
OPTIONAL_OPTIONS: dict[str, type] = {"ss_duration": float, "ss_max_tokens": int, "ss_burst_size": int,
                                     "ss_tokenizer": str, "ss_plan": str}


def normalize_web_ui_options(options: Any) -> None:
    """Give back their types to the options a /swarm request set as text (an empty value is ``None``)."""
    for name, kind in OPTIONAL_OPTIONS.items():
        value = getattr(options, name)
        if isinstance(value, str):
            text = value.strip()
            try:
                setattr(options, name, kind(text) if text else None)
            except ValueError:
                what = "a whole number" if kind is int else "a number"
                raise ValueError(f"--{name.replace('_', '-')} must be {what}, got {value!r}") from None


def plain_config(options: Any, num_users: int, num_workers: int) -> LoadConfig:
    """The load config of a plain run: Locust's users (or ``--ss-rate``) and the ``--ss-*`` workload flags."""
    rate = options.ss_rate if options.ss_rate > 0 else None
    seconds = options.ss_duration or options.run_time or DEFAULT_PLAN_SECONDS
    config = LoadConfig(
        users=None if rate is not None else max(num_users, num_workers, 1), rate=rate, duration_s=float(seconds),
        warmup_s=options.ss_warmup, workload=options.ss_workload, seed=options.ss_seed, processes=num_workers,
        max_tokens=options.ss_max_tokens, burstiness=options.ss_burstiness, burst_size=options.ss_burst_size,
        api=options.ss_api, ignore_eos=bool(options.ss_ignore_eos),
    )
    if options.stop_timeout:
        config.stop_timeout_s = float(options.stop_timeout)
    return config


@dataclass(slots=True)
class PlainRun:
    """One test of a plain Locust process, from its ``test_start`` to its ``test_stop``."""

    run_dir: Path
    config: LoadConfig
    target: Target
    tokenizer: str
    probes: ProbeProcess
    started_at: float
    users_timeline: list[dict[str, float]] = field(default_factory=list)
    sampler: gevent.Greenlet | None = None
    stopped_at: float | None = None  # when Locust stopped the users (the run is written after)
    is_finished: bool = False

    @classmethod
    def start(cls, environment: Environment, num_workers: int, base_run_dir: str | None,
              probes: ProbeProcess) -> PlainRun:
        """Build the plan, start the probes and write the run directory's first files; set the workers' options.

        ``base_run_dir`` is ``--ss-run-dir`` as given (``None``: ``runs/locust-<timestamp>``).
        """
        from loadtests.run.orchestrator import tokenizer_name_for
        from loadtests.run.target import discover_target
        from loadtests.workloads.tokenizer import load_tokenizer

        options = environment.parsed_options
        runner = environment.runner
        assert options is not None and runner is not None
        normalize_web_ui_options(options)
        if not environment.host:
            raise ValueError("no target: give --host http://HOST:PORT (or fill in Host in the web UI)")
        named = set(options.user_classes or [])
        if "OpenLoopUser" in named and not options.ss_rate > 0:
            raise ValueError("OpenLoopUser sends on a schedule: give its rate with --ss-rate R (requests/s)")
        target = discover_target(environment.host, options.ss_model or None, os.environ.get(API_KEY_ENV) or None)
        config = plain_config(options, int(runner.target_user_count or options.num_users or 1), num_workers)
        tokenizer = tokenizer_name_for(target, options.ss_tokenizer)
        run_dir = fresh_run_dir(Path(base_run_dir) if base_run_dir else default_run_dir())
        plan = build_plan(config, load_tokenizer(tokenizer), target.max_model_len)
        probes.start(run_dir, target, config)
        write_plan(run_dir / PLAN_NAME, plan)
        run = cls(run_dir, config, target, tokenizer, probes, time.time())
        run.write_load_info(num_planned_requests=len(plan))
        # NOTE: what the orchestrator passes on its command line; the master sends these to its workers.
        options.ss_run_dir, options.ss_plan = str(run_dir), str(run_dir / PLAN_NAME)
        options.ss_model, options.ss_num_workers, options.ss_burst_size = target.model, num_workers, config.burst_size
        run.sampler = gevent.spawn(run._sample_users, environment)
        logger.info("servescope: %s (%s, %s), run directory %s", target.url, target.model, config.point_name, run_dir)
        return run

    def _sample_users(self, environment: Environment) -> None:
        while True:
            self.record_users(environment)
            gevent.sleep(USER_SAMPLE_INTERVAL_S)

    def record_users(self, environment: Environment) -> None:
        """Append the user count when it changed since the last sample."""
        runner = environment.runner
        if runner is None:
            return
        users = int(runner.user_count)
        if not self.users_timeline or self.users_timeline[-1]["users"] != users:
            self.users_timeline.append({"time": time.time(), "users": users})

    def write_load_info(self, **changes: Any) -> None:
        """``load.json``, as ``servescope load`` writes it, plus how Locust was run and the users over time."""
        directory = RunDirectory(self.run_dir)
        info = directory.load_info() or LoadInfo(config={})
        info = dataclasses.replace(
            info, config=self.config.to_dict(), server="external", tokenizer=self.tokenizer,
            metrics_url=self.target.metrics_url, target=self.target.url, model=self.target.model,
            max_model_len=self.target.max_model_len, started_at=self.started_at, started_by="locust (plain)",
            users_timeline=list(self.users_timeline), **changes)
        directory.save(LOAD_NAME, info)

    def note_stopped(self) -> None:
        """The load ended now (Locust stopped the users); what comes after is writing the run."""
        if self.stopped_at is None:
            self.stopped_at = time.time()

    def finish(self, environment: Environment) -> None:
        """Stop the probes; merge the client rows; write Locust's stats, ``load.json``, the summary and report."""
        from rich.console import Console

        from loadtests.client.table import merge_journals, take_worker_roster
        from loadtests.errors import RunFailedError
        from loadtests.run.finish import finish_run

        if self.is_finished:
            return
        self.is_finished = True
        if self.sampler is not None:
            self.sampler.kill(block=False)
        self.record_users(environment)
        if self.probes.stop() != 0:
            logger.warning("servescope: the probe process failed; its tables in %s may be missing", self.run_dir)
        merge_journals(self.run_dir)
        roster = take_worker_roster(self.run_dir)
        write_locust_stats(environment, self.run_dir)
        self.note_stopped()
        assert self.stopped_at is not None
        # NOTE: the config records the load as it ran: its length, and the most users it reached.
        peak_users = max((int(step["users"]) for step in self.users_timeline), default=0)
        if self.config.users is not None and peak_users > 0:
            self.config = dataclasses.replace(self.config, users=max(peak_users, self.config.processes))
        self.config = dataclasses.replace(
            self.config, duration_s=max(self.stopped_at - self.started_at - self.config.warmup_s, 1e-3))
        self.write_load_info(stopped_at=self.stopped_at, finished_at=time.time(),
                             workers=roster.workers if roster is not None else None)
        try:
            finish_run(self.run_dir, Console(stderr=True))
        except (RunFailedError, ValueError, FileNotFoundError) as exc:
            logger.error("servescope: %s", exc)
            return
        logger.info("servescope: wrote %s; `servescope report %s` rewrites its report", self.run_dir, self.run_dir)


class PlainRuns:
    """The plain runs of one Locust process (the web UI may start and stop several tests).

    NOTE: built at Locust's init, before ``-t`` starts counting: the heavy imports happen here, and
    the next run's probe process is spawned ahead, so a test's start costs little of its time.
    """

    def __init__(self, options: Any) -> None:
        from loadtests.run import orchestrator  # noqa: F401 - imported now, used at test_start
        from loadtests.run.probe_process import ProbeProcess
        from loadtests.workloads import tokenizer  # noqa: F401 - imported now, used at test_start

        self.run_dir: str | None = options.ss_run_dir  # as given: each test's directory is a fresh one from it
        self.is_headless = bool(options.headless)
        self.current: PlainRun | None = None
        self.next_probes: ProbeProcess | None = ProbeProcess.spawn()
        self.next_probes.wait_imported()

    def start(self, environment: Environment, num_workers: int) -> None:
        from loadtests.run.probe_process import ProbeProcess

        probes, self.next_probes = self.next_probes or ProbeProcess.spawn(), None
        try:
            self.current = PlainRun.start(environment, num_workers, self.run_dir, probes)
        except BaseException:
            probes.stop()
            raise

    def finish(self, environment: Environment) -> None:
        """Write the current run, if one is running; with the web UI, spawn the next run's probes."""
        from loadtests.run.probe_process import ProbeProcess

        run, self.current = self.current, None
        if run is None:
            return
        try:
            run.finish(environment)
        finally:
            if not self.is_headless and self.next_probes is None:
                self.next_probes = ProbeProcess.spawn()


def write_locust_stats(environment: Environment, run_dir: Path) -> Path:
    """Locust's stats table as ``locust_stats.csv`` in the run directory (what the summary's accounting reads)."""
    from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

    path = run_dir / LOCUST_STATS_NAME
    with open(path, "w", newline="", encoding="utf-8") as f:
        StatsCSV(environment, PERCENTILES_TO_REPORT).requests_csv(csv.writer(f))
    return path
