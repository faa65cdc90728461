"""How hard each Locust worker process works while it loads: ``client_health-<worker>.jsonl``.

A client that is itself the bottleneck reads the server's timing wrong: its greenlets wake late,
so token times (and TTFT, ITL) come out late by as much. Each worker runs a :class:`HealthSampler`
greenlet that wakes every ``SAMPLE_INTERVAL_S`` and records how late it woke (the event loop's
lag, which every token timestamp of that worker shares) and the process's CPU time over the gap
as a share of one core; with them, the load's live counts (content chunks so far, requests in
flight and decoding), which a point's stopping rule reads while it runs (:mod:`loadtests.point_stop`).
The orchestrator merges the journals into ``client_health.parquet``
(:func:`loadtests.client.table.merge_health_journals`); ``reports.summary`` turns them into the run's client warnings.

Light on purpose (stdlib, psutil, gevent): Locust's processes import it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import psutil

from loadtests.client.records import HEALTH_PREFIX, JOURNAL_SUFFIX, Clock, LineSink

# Seconds between samples: short enough to catch a saturated loop, long enough to cost nothing.
SAMPLE_INTERVAL_S = 0.2


class HealthSampler:
    """One worker's sampler: a greenlet writing ``{worker, time, loop_lag_s, cpu_share}`` lines to ``lines``
    (its journal file, :func:`health_path`, or its master), which it closes when stopped."""

    def __init__(self, lines: LineSink, worker: str, clock: Clock, interval_s: float = SAMPLE_INTERVAL_S,
                 progress: Callable[[], dict[str, int]] | None = None) -> None:
        self.worker = worker
        self.progress = progress  # the load's own counts, added to each sample (loadtests.point_stop reads them live)
        self.clock = clock
        self.interval_s = interval_s
        self.num_samples = 0
        self._process = psutil.Process()
        self._lines: LineSink | None = lines
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()
            self._greenlet = None
        if self._lines is not None:
            self._lines.close()
            self._lines = None

    def _cpu_s(self) -> float:
        times = self._process.cpu_times()
        return times.user + times.system

    def _run(self) -> None:
        last_t, last_cpu = self.clock.now(), self._cpu_s()
        while True:
            due = last_t + self.interval_s
            gevent.sleep(max(due - self.clock.now(), 0.0))
            now, cpu = self.clock.now(), self._cpu_s()
            self._write({"worker": self.worker, "time": now, "loop_lag_s": max(now - due, 0.0),
                         "cpu_share": (cpu - last_cpu) / (now - last_t) if now > last_t else 0.0,
                         **(self.progress() if self.progress is not None else {})})
            last_t, last_cpu = now, cpu

    def _write(self, sample: dict[str, Any]) -> None:
        if self._lines is None:
            return
        self._lines.write_line(json.dumps(sample, separators=(",", ":")))
        self.num_samples += 1


def health_path(run_dir: str | os.PathLike[str], worker: str) -> Path:
    return Path(run_dir) / f"{HEALTH_PREFIX}{worker}{JOURNAL_SUFFIX}"
