"""The master's side of a run with workers: their rows into the run directory, who finished, who was lost.

A :class:`WorkerCollector` lives in the Locust master (``--processes N`` here, or ``servescope load
--master`` with ``servescope worker`` anywhere). It

- keeps ``workers.json`` (:class:`probes.run_dir.WorkerRoster`) up to date: each worker that joins,
  and, once the test starts, each one taking part, with its counts;
- sends the plan to every worker when the test starts (:mod:`loadtests.client.relay`);
- appends each worker's batches of lines to that worker's journals in the run directory;
- marks a worker lost when Locust stops hearing its heartbeats (its state turns ``missing``) or
  drops it before it said it was done; what it sent so far stays, and what it had in flight is
  counted (:attr:`probes.run_dir.LoadWorker.num_unrecorded`);
- calls ``on_finished`` once every worker taking part has ended its load or been lost.

NOTE: a worker is lost only while it stays silent: one that was starved of CPU past Locust's
heartbeat limit and then sends again is taken back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from locust.env import Environment
from locust.runners import STATE_MISSING, MasterRunner

from loadtests.client.health import health_path
from loadtests.client.load_context import worker_name
from loadtests.client.records import LineFile, journal_path
from loadtests.client.relay import DONE_MESSAGE, HEALTH, PLAN_MESSAGE, REQUESTS, ROWS_MESSAGE, encode_plan
from probes.run_dir import (
    LOST_CUT_OFF,
    LOST_LEFT_EARLY,
    LOST_MISSED_HEARTBEATS,
    WORKERS_NAME,
    LoadWorker,
    RunDirectory,
    WorkerRoster,
)

logger = logging.getLogger(__name__)

# Seconds between looks at the workers' heartbeat state.
LOST_CHECK_INTERVAL_S = 1.0


class WorkerCollector:
    """See the module docstring; ``run_dir`` is read from ``--ss-run-dir`` when needed (a plain run sets it late)."""

    def __init__(self, environment: Environment, on_finished: Callable[[], None]) -> None:
        runner = environment.runner
        assert isinstance(runner, MasterRunner)
        self.environment = environment
        self.runner: MasterRunner = runner
        self.on_finished = on_finished
        self.roster = WorkerRoster(int(environment.parsed_options.ss_num_workers), [])
        self._ended: set[str] = set()  # workers whose load ended itself
        self._files: dict[tuple[str, str], LineFile] = {}
        self._watcher: gevent.Greenlet | None = None
        self._is_collecting = False  # from the test's start to its stop
        self._has_finished = False
        runner.register_message(ROWS_MESSAGE, self._on_rows)
        runner.register_message(DONE_MESSAGE, self._on_done)
        environment.events.worker_connect.add_listener(self._on_connect)

    @property
    def run_dir(self) -> Path | None:
        run_dir = self.environment.parsed_options.ss_run_dir
        return Path(run_dir) if run_dir is not None else None

    def begin(self, plan_path: Path) -> None:
        """The test starts: the workers connected now take part; each gets the plan."""
        self.close_files()
        self._ended.clear()
        self._is_collecting, self._has_finished = True, False
        self.roster = WorkerRoster(int(self.environment.parsed_options.ss_num_workers),
                                   [self._new_worker(node) for node in self._connected()], time.time())
        self.runner.send_message(PLAN_MESSAGE, encode_plan(plan_path))
        self._write_roster()
        if self._watcher is None:
            self._watcher = gevent.spawn(self._watch)

    def end(self) -> None:
        """The test stopped: a worker neither done nor lost is cut off; the journals close."""
        self._is_collecting = False
        if self._watcher is not None:
            self._watcher.kill()
            self._watcher = None
        for worker in self.roster.workers:
            if not worker.is_done and worker.lost is None:
                worker.lost = LOST_CUT_OFF
        self._write_roster()
        self.close_files()
        everyone_lost = bool(self.roster.workers) and all(w.lost is not None for w in self.roster.workers)
        if everyone_lost and self.environment.parsed_options.ss_duration is not None and not self._has_finished:
            # NOTE: Locust stops (but does not quit) a headless master whose last worker went missing.
            self._has_finished = True
            self.on_finished()

    def close_files(self) -> None:
        for lines in self._files.values():
            lines.close()
        self._files.clear()

    # -- messages -----------------------------------------------------------------------------
    def _on_connect(self, client_id: str, **_kwargs: Any) -> None:
        if self.roster.started_at is None and self._find(client_id) is None:
            self.roster.workers.append(self._new_worker(client_id))
            self._write_roster()

    def _on_rows(self, environment: Environment, msg: Any, **_kwargs: Any) -> None:
        worker = self._taking_part(msg.node_id, msg.data["worker"])
        run_dir = self.run_dir
        if worker is None or run_dir is None:
            return
        for kind, lines in msg.data["lines"].items():
            if lines:
                sink = self._file(run_dir, kind, worker.worker)
                for line in lines:
                    sink.write_line(line)
        worker.num_rows += len(msg.data["lines"].get(REQUESTS, ()))
        worker.num_started = max(worker.num_started, int(msg.data["num_started"]))

    def _on_done(self, environment: Environment, msg: Any, **_kwargs: Any) -> None:
        worker = self._taking_part(msg.node_id, msg.data["worker"])
        if worker is None:
            return
        worker.is_done = True
        worker.num_started = max(worker.num_started, int(msg.data["num_started"]))
        if worker.num_rows != int(msg.data["num_rows"]):
            logger.warning("servescope: %s sent %s rows, %d arrived", worker.worker, msg.data["num_rows"],
                           worker.num_rows)
        if msg.data.get("ended_itself"):
            self._ended.add(worker.worker)
        self._write_roster()
        self._check_finished()

    # -- lost workers -------------------------------------------------------------------------
    def _watch(self) -> None:
        # NOTE: runs until end() (the master's test_stop), which Locust's -t bounds.
        while True:
            gevent.sleep(LOST_CHECK_INTERVAL_S)
            self.mark_lost()

    def mark_lost(self) -> None:
        """Mark each worker taking part that Locust no longer hears, and has not said it is done."""
        changed = False
        for worker in self.roster.workers:
            if worker.is_done or worker.lost is not None:
                continue
            client = self.runner.clients.get(worker.node)
            if client is None or client.state == STATE_MISSING:
                worker.lost = LOST_LEFT_EARLY if client is None else LOST_MISSED_HEARTBEATS
                logger.warning("servescope: worker %s (%s) %s; %d of its requests recorded, %d in flight unrecorded",
                               worker.worker, worker.node, worker.lost, worker.num_rows, worker.num_unrecorded)
                changed = True
        if changed:
            self._write_roster()
            self._check_finished()

    def _check_finished(self) -> None:
        # NOTE: only a run that ends itself (--ss-duration) finishes when its workers do; a plain run's
        # users send until Locust (or the web UI) stops them.
        if self._has_finished or not self._is_collecting or self.environment.parsed_options.ss_duration is None:
            return
        if all(w.worker in self._ended or w.lost is not None for w in self.roster.workers):
            self._has_finished = True
            self.on_finished()

    # -- helpers ------------------------------------------------------------------------------
    def _connected(self) -> list[str]:
        return [c.id for c in self.runner.clients.all if c.state != STATE_MISSING]

    def _new_worker(self, node: str) -> LoadWorker:
        return LoadWorker(worker=worker_name(self.runner.get_worker_index(node)), node=node)

    def _find(self, node: str) -> LoadWorker | None:
        return next((w for w in self.roster.workers if w.node == node), None)

    def _taking_part(self, node: str, name: str) -> LoadWorker | None:
        """The roster's entry for a message's sender; a lost one that speaks again is taken back."""
        if not self._is_collecting:
            return None  # NOTE: after the test stopped, its journals may be merged and its roster taken
        worker = self._find(node)
        if worker is None:
            logger.warning("servescope: rows from %s (%s), which is not taking part in the test; dropped", name, node)
            return None
        if worker.lost == LOST_MISSED_HEARTBEATS:
            logger.warning("servescope: worker %s is heard again; it was not lost", worker.worker)
            worker.lost = None
        return worker

    def _file(self, run_dir: Path, kind: str, worker: str) -> LineFile:
        key = (kind, worker)
        if key not in self._files:
            if kind not in (REQUESTS, HEALTH):
                raise ValueError(f"unknown line kind {kind!r} from {worker}")
            self._files[key] = LineFile(journal_path(run_dir, worker) if kind == REQUESTS
                                        else health_path(run_dir, worker))
        return self._files[key]

    def _write_roster(self) -> None:
        run_dir = self.run_dir
        if run_dir is not None and run_dir.is_dir():
            RunDirectory(run_dir).save(WORKERS_NAME, self.roster)
