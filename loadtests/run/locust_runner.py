"""Run Locust headless as a child process over our locustfile, and read back the stats it wrote.

One process (``--processes 1``) is Locust's local runner; more is its own master/worker mode:
``--processes N`` forks N workers here; with ``LoadConfig.master`` the master waits for that many
``servescope worker`` processes to join from anywhere. Either way the master merges the stats and
gathers the workers' client rows (:mod:`loadtests.client.collector`).
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from loadtests.client.load_context import API_KEY_ENV
from loadtests.config import LOCUSTFILE, LoadConfig
from loadtests.errors import LocustFailedError, WorkersMissingError
from loadtests.run.processes import kill_group, spawn
from probes.run_dir import (
    LOCUST_CSV_PREFIX,
    LOCUST_HTML_NAME,
    LOCUST_LOG_NAME,
    LOCUST_STATS_NAME,
    WORKERS_NAME,
    RunDirectory,
    WorkerRoster,
)

# Seconds past run time + stop timeout before Locust's own -t stops the run. The run normally
# ends itself once the last in-flight request is done (see loadtests.locustfile); -t only bounds it.
RUN_TIME_MARGIN_S = 10.0
# Seconds Locust may take to start (import, fork workers) and to write its files.
STARTUP_ALLOWANCE_S = 60.0
TICK_S = 1.0


@dataclass(slots=True)
class LocustRun:
    """What came back from one Locust run."""

    returncode: int
    stats_csv: Path
    log_path: Path
    wall_s: float


def locust_command(config: LoadConfig, url: str, run_dir: Path, model: str) -> list[str]:
    """The headless Locust command line for one load point against ``url``."""
    num_users = config.users if config.users is not None else config.processes
    if config.is_trace:
        user_class = "TraceUser"
    elif config.workload == "chat-sessions":
        user_class = "ChatSessionUser"
    else:
        user_class = "LLMUser" if config.users is not None else "OpenLoopUser"
    run_time = config.run_time_s + config.stop_timeout_s + RUN_TIME_MARGIN_S  # Locust takes whole seconds
    argv = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(num_users), "-r", str(num_users), "-t", f"{math.ceil(run_time)}s",
        "--host", url, "--stop-timeout", f"{config.stop_timeout_s:g}",
        "--csv", str(run_dir / LOCUST_CSV_PREFIX), "--html", str(run_dir / LOCUST_HTML_NAME), "--only-summary",
        "--exit-code-on-error", "0", "--loglevel", "INFO",
        "--ss-run-dir", str(run_dir), "--ss-model", model, "--ss-api", config.api,
        "--ss-warmup", f"{config.warmup_s:g}", "--ss-duration", f"{config.duration_s:g}",
        "--ss-rate", f"{config.rate or 0:g}", "--ss-burstiness", f"{config.burstiness:g}",
        "--ss-burst-size", str(config.burst_size), "--ss-seed", str(config.seed),
        "--ss-num-workers", str(config.processes), "--ss-ignore-eos", str(int(config.ignore_eos)),
        "--ss-trace", str(int(config.is_trace)), "--ss-controlled", str(int(config.stop_rule is not None)),
    ]
    if config.master is not None:
        argv += ["--master", "--master-bind-host", config.master.bind_host,
                 "--master-bind-port", str(config.master.bind_port), "--expect-workers", str(config.processes),
                 "--expect-workers-max-wait", str(math.ceil(config.master.wait_s))]
    elif config.processes > 1:
        argv += ["--processes", str(config.processes)]
    return [*argv, user_class]


def run_locust(config: LoadConfig, url: str, run_dir: Path, model: str,
               on_tick: Callable[[float], None] | None = None, api_key: str | None = None) -> LocustRun:
    """Run one load point; ``on_tick(elapsed_s)`` is called about once a second while it runs.

    ``api_key`` reaches the workers through the environment, never their command line.
    """
    env = dict(os.environ)
    if api_key:
        env[API_KEY_ENV] = api_key
    log_path = run_dir / LOCUST_LOG_NAME
    limit_s = config.run_time_s + 2 * config.stop_timeout_s + RUN_TIME_MARGIN_S + STARTUP_ALLOWANCE_S
    if config.master is not None:
        limit_s += config.master.wait_s  # NOTE: -t starts counting once every worker has joined
    started = time.monotonic()
    with open(log_path, "ab") as log:
        process = spawn(locust_command(config, url, run_dir, model), stdout=log,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            while process.poll() is None:
                elapsed = time.monotonic() - started
                if elapsed > limit_s:
                    kill_group(process)
                    raise LocustFailedError(f"Locust ran past {limit_s:.0f} s and was killed; see {log_path}")
                if on_tick is not None:
                    on_tick(elapsed)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(TICK_S)
        except BaseException:  # Ctrl-C, SIGTERM (see loadtests.cli), a failed tick: no worker outlives us
            kill_group(process)
            raise
        kill_group(process)  # workers a crashed master left behind
    wall_s = time.monotonic() - started
    stats_csv = run_dir / LOCUST_STATS_NAME
    if config.master is not None:
        _check_workers_came(config, run_dir)
    if process.returncode != 0 or not stats_csv.is_file():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise LocustFailedError(f"Locust exited with status {process.returncode}; {log_path} ends:\n{tail}")
    return LocustRun(process.returncode, stats_csv, log_path, wall_s)


def _check_workers_came(config: LoadConfig, run_dir: Path) -> None:
    """Raise :class:`WorkersMissingError` when the master gave up waiting for its workers."""
    assert config.master is not None
    roster = RunDirectory(run_dir).load(WORKERS_NAME, WorkerRoster)
    if roster is not None and roster.started_at is not None:
        return
    came = roster.workers if roster is not None else []
    names = f" ({', '.join(f'{w.worker} from {w.node}' for w in came)})" if came else ""
    port = config.master.bind_port
    raise WorkersMissingError(
        f"the master waited {config.master.wait_s:g} s on {config.master.bind_host}:{port} for {config.processes} "
        f"workers; {len(came)} came{names}. Start each with `servescope worker --master-host <this host> "
        f"--master-port {port}`, or wait longer with --worker-wait")


def read_locust_stats(run_dir: Path) -> pd.DataFrame:
    """Locust's final stats table (``locust_stats.csv``), one row per (Type, Name) plus Aggregated."""
    return pd.read_csv(run_dir / LOCUST_STATS_NAME)
