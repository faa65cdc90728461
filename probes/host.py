"""Host-side load: the process's CPU % and RSS, and every core's utilization (psutil)."""

from __future__ import annotations

import os
import time
from typing import Any

import psutil
import pyarrow as pa

from probes import schemas
from probes.base import tuples_table
from probes.run_dir import RunDirectory
from probes.sampler import SamplerProbe


class HostProbe(SamplerProbe):
    """One row per sample: process CPU % (100 = one core busy), RSS, thread count, system and per-core CPU %.

    Percentages cover the time since the previous sample; the first sample covers the time since
    ``start()``. ``pid`` watches another process (a server), by default this one.

    NOTE: ``psutil.cpu_percent`` keeps its "previous sample" per Python process; another caller
    of it in this process shortens the window the system columns cover.
    """

    name = "host"
    schema = schemas.HOST

    def __init__(self, run_dir: RunDirectory, interval_s: float = 0.5, pid: int | None = None) -> None:
        super().__init__(run_dir, interval_s)
        self.pid = os.getpid() if pid is None else pid
        self.status.settings["pid"] = self.pid
        self._process: psutil.Process | None = None

    def _open(self) -> bool:
        try:
            self._process = psutil.Process(self.pid)
            # NOTE: the first interval=None reading is meaningless; these calls start the windows.
            self._process.cpu_percent(None)
        except psutil.Error as exc:
            self.mark_unavailable(f"process {self.pid}: {exc}")
            return False
        psutil.cpu_percent(None, percpu=True)
        self.status.settings["num_cores"] = psutil.cpu_count()
        return True

    def _sample(self) -> None:
        assert self._process is not None
        now = time.time()
        with self._process.oneshot():
            process_cpu = self._process.cpu_percent(None)
            rss = self._process.memory_info().rss
            num_threads = self._process.num_threads()
        per_core = psutil.cpu_percent(None, percpu=True)
        system = sum(per_core) / len(per_core) if per_core else None
        self._record((now, process_cpu, rss, num_threads, system, per_core))

    def _to_table(self, rows: list[tuple[Any, ...]], is_final: bool) -> pa.Table:
        return tuples_table(self.schema, rows)
