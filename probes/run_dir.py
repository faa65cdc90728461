"""The run directory on disk: every file's name, its typed records, atomic writes, Parquet parts.

This module owns the layout; every writer and reader of a run directory goes through it::

    run.json                      the manifest (probes.manifest.RunManifest)
    steps.parquet, requests.parquet, nvml.parquet, host.parquet, prometheus.parquet
    steps.part-000000.parquet     parts a probe flushed while running; merged into steps.parquet on stop
    client_requests.parquet       one client row per request (probes.schemas.CLIENT_REQUESTS)
    client_health.parquet         each load worker's event-loop lag and CPU, sampled (probes.schemas.CLIENT_HEALTH)
    trace.json                    Chrome / Perfetto trace
    machine_peaks.json            probes.peaks.MachinePeaks, measured before the engine started
    step_calibration.json         probes.step_calibration.StepCalibration, measured before the load
    execution_reference.json      probes.execution_paths.PathTiming: an outside server's decode step against ours
    load.json                     LoadInfo: the load point's config, its target and model, its load workers
    workers.json                  WorkerRoster: while a Locust master runs, the workers that joined it (then in load.json)
    point_control.json            while a point with a stopping rule runs: when its window opens and ends (loadtests.client.point_control)
    workload.jsonl                the request plan (loadtests.plan)
    locust_stats.csv, locust_stats_history.csv, locust.html, locust.log, server.log
    summary.json                  the measures of every point (reports.summary.RunSummary)
    diagnosis.json, report.html   the verdict (reports.verdict.diagnosis.Diagnosis) and the page

A sweep directory holds ``sweep.json`` (:class:`SweepIndex`) and one run directory per point; an
ablation directory holds ``ablation.json`` and one directory per variant. A capacity search's directory
is a sweep's with ``capacity.json`` (reports.capacity.records.CapacitySearch); each round of a
``--retest`` holds ``retest.json`` (the lever pulled to reach it, what the lever it named gave).

NOTE: every file appears only through a temp file + ``os.replace``, so a reader (or a run that
crashed) never sees half a file: each name holds either nothing or a complete file. Temp files start
with a dot and end in ``.tmp``; readers ignore them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from probes.peaks import MachinePeaks

# Where servescope writes what it makes when no --out says otherwise: run directories, compare pages (git ignores it).
RUNS_DIR = Path("runs")
MANIFEST_NAME = "run.json"
TRACE_NAME = "trace.json"
PEAKS_NAME = "machine_peaks.json"
LOAD_NAME = "load.json"
PLAN_NAME = "workload.jsonl"
SWEEP_NAME = "sweep.json"
ABLATION_NAME = "ablation.json"
SUMMARY_NAME = "summary.json"
DIAGNOSIS_NAME = "diagnosis.json"
REPORT_NAME = "report.html"
CLIENT_TABLE = "client_requests"
CLIENT_HEALTH_TABLE = "client_health"
LOCUST_CSV_PREFIX = "locust"  # Locust writes locust_stats.csv, locust_stats_history.csv, ...
LOCUST_STATS_NAME = f"{LOCUST_CSV_PREFIX}_stats.csv"
LOCUST_HTML_NAME = "locust.html"
LOCUST_LOG_NAME = "locust.log"
SERVER_LOG_NAME = "server.log"
WORKERS_NAME = "workers.json"
CONTROL_NAME = "point_control.json"
PORT_FILE_NAME = ".server-port.json"
GPU_CHECK_NAME = "gpu_check.json"
CALIBRATION_NAME = "step_calibration.json"
EXECUTION_REFERENCE_NAME = "execution_reference.json"
CAPACITY_NAME = "capacity.json"
RETEST_NAME = "retest.json"
PARQUET_SUFFIX = ".parquet"
PART_INFIX = ".part-"

R = TypeVar("R", bound="JsonRecord")


class RunFileError(ValueError):
    """A run directory's file is unreadable or malformed; the message names the file."""


class JsonRecord(Protocol):
    """A record saved as one JSON file: ``to_dict`` and ``from_dict`` round-trip it."""

    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R: ...


# Why a worker dropped out of a run before it was done (LoadWorker.lost).
LOST_MISSED_HEARTBEATS = "stopped answering the master's heartbeats"
LOST_LEFT_EARLY = "left the master before it was done"
LOST_CUT_OFF = "had not sent all its rows when the master stopped"


@dataclass(slots=True)
class LoadWorker:
    """One Locust worker process of a run with a master (``--processes N`` or ``--master``), as the master saw it."""

    worker: str  # "w0": the name its client rows carry
    node: str  # Locust's id for it: the worker's host name and a random suffix
    num_rows: int = 0  # client rows the master received from it
    num_started: int = 0  # requests it had sent by its last message, recorded or in flight
    is_done: bool = False  # it said its users had finished and its rows were all sent
    lost: str | None = None  # why it dropped out before it was done (LOST_*); None: it was not lost

    @property
    def num_unrecorded(self) -> int:
        """Requests it had sent, as of its last message, whose rows never reached the master."""
        return max(self.num_started - self.num_rows, 0)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadWorker:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(slots=True)
class WorkerRoster:
    """``workers.json``: the workers a Locust master waited for, and each that joined, as it stands now.

    Written by the master while Locust runs (each join, finish or loss); the orchestrator moves
    its workers into ``load.json`` when the run ends.
    """

    num_expected: int
    workers: list[LoadWorker]
    started_at: float | None = None  # when the test started (every expected worker had joined)

    @property
    def lost(self) -> list[LoadWorker]:
        return [w for w in self.workers if w.lost is not None]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerRoster:
        try:
            return cls(int(data["num_expected"]), [LoadWorker.from_dict(w) for w in data["workers"]],
                       data.get("started_at"))
        except (KeyError, TypeError, ValueError) as exc:
            raise RunFileError(f"{WORKERS_NAME} is malformed: {type(exc).__name__}: {exc}") from exc


@dataclass(slots=True)
class LoadInfo:
    """``load.json``: one load point's settings (``LoadConfig.to_dict()``), its target and how it went."""

    config: dict[str, Any]
    server: str | None = None  # "servescope (probed)" or "external"
    target: str | None = None
    model: str | None = None
    max_model_len: int | None = None
    tokenizer: str | None = None
    metrics_url: str | None = None
    serve_argv: list[str] | None = None
    server_pid: int | None = None
    num_planned_requests: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    locust_returncode: int | None = None
    locust_wall_s: float | None = None
    dropped_fields: list[str] | None = None  # request fields the target refused, left out of the load
    started_by: str | None = None  # "locust (plain)" for a run started with `locust -f`, else servescope
    users_timeline: list[dict[str, float]] | None = None  # {"time", "users"} at each user-count change
    stopped_at: float | None = None  # when the load ended (before the run was written)
    workers: list[LoadWorker] | None = None  # a run with a Locust master: each worker, lost ones marked
    window: dict[str, Any] | None = None  # a point with a stopping rule: its window and why (loadtests.point_stop)

    @property
    def decided_window(self) -> tuple[float, float] | None:
        """``(measure_from, stop_at)`` as a point's stopping rule decided them; None for a fixed window."""
        w = self.window or {}
        if w.get("measure_from") is None or w.get("stop_at") is None:
            return None
        return float(w["measure_from"]), float(w["stop_at"])

    @property
    def lost_workers(self) -> list[LoadWorker]:
        return [w for w in self.workers or [] if w.lost is not None]

    @property
    def point(self) -> str | None:
        return self.config.get("point")

    @property
    def concurrency(self) -> float | None:
        """Closed-loop users, else the open-loop rate (what a sweep varies)."""
        value = self.config.get("users") if self.config.get("users") is not None else self.config.get("rate")
        return float(value) if value is not None else None

    @property
    def slo(self) -> dict[str, float]:
        return dict(self.config.get("slo") or {})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadInfo:
        if not isinstance(data.get("config"), dict):
            raise RunFileError(f"{LOAD_NAME} needs a 'config' object")
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        if fields.get("workers") is not None:
            fields["workers"] = [LoadWorker.from_dict(w) for w in fields["workers"]]
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    value: float
    dir: str


@dataclass(slots=True)
class SweepIndex:
    """``sweep.json``: which parameter a sweep varies, and each point's run directory."""

    parameter: str
    points: list[SweepPoint]

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]

    def to_dict(self) -> dict[str, Any]:
        return {"parameter": self.parameter, "values": self.values,
                "points": [{"value": p.value, "dir": p.dir} for p in self.points]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepIndex:
        try:
            return cls(str(data["parameter"]), [SweepPoint(float(p["value"]), str(p["dir"])) for p in data["points"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise RunFileError(f"{SWEEP_NAME} is malformed: {type(exc).__name__}: {exc}") from exc


class RunDirectory:
    """A directory holding one run's files; every write is atomic."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> RunDirectory:
        """Make a fresh run directory; refuses one that already holds a manifest."""
        run_dir = cls(path)
        run_dir.path.mkdir(parents=True, exist_ok=True)
        if run_dir.manifest_path.exists():
            raise FileExistsError(f"{run_dir.path} already holds a run ({MANIFEST_NAME}); pick a new directory")
        return run_dir

    def file(self, name: str) -> Path:
        """The path of one of this module's file names in the directory."""
        return self.path / name

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_NAME

    @property
    def trace_path(self) -> Path:
        return self.path / TRACE_NAME

    def table_path(self, name: str) -> Path:
        return self.path / f"{name}{PARQUET_SUFFIX}"

    def part_path(self, name: str, index: int) -> Path:
        return self.path / f"{name}{PART_INFIX}{index:06d}{PARQUET_SUFFIX}"

    def part_paths(self, name: str) -> list[Path]:
        """The part files of table ``name``, in the order they were written."""
        # NOTE: zero-padded indices make lexical order the write order.
        return sorted(self.path.glob(f"{name}{PART_INFIX}[0-9]*{PARQUET_SUFFIX}"))

    # -- records ------------------------------------------------------------------------------
    def save(self, name: str, record: JsonRecord) -> Path:
        """Write ``record`` as JSON file ``name`` (NaN and infinity become null)."""
        return self.write_json(name, json_safe(record.to_dict()))

    def load(self, name: str, kind: type[R]) -> R | None:
        """The record in JSON file ``name``, or None when the directory has no such file."""
        data = self.read_json(name)
        return None if data is None else kind.from_dict(data)

    def read_json(self, name: str) -> dict[str, Any] | None:
        """JSON object file ``name``; None when absent, :class:`RunFileError` when unreadable."""
        path = self.path / name
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise RunFileError(f"{path} is not readable JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise RunFileError(f"{path} must hold a JSON object")
        return data

    def load_info(self) -> LoadInfo | None:
        return self.load(LOAD_NAME, LoadInfo)

    def sweep_index(self) -> SweepIndex | None:
        return self.load(SWEEP_NAME, SweepIndex)

    def write_peaks(self, peaks: MachinePeaks) -> Path:
        return self.save(PEAKS_NAME, peaks)

    def read_peaks(self) -> MachinePeaks | None:
        return self.load(PEAKS_NAME, MachinePeaks)

    # -- writes -------------------------------------------------------------------------------
    def write_json(self, name: str, obj: Any, indent: int | None = 2) -> Path:
        """Write ``obj`` as JSON; NaN or infinity is an error, as JSON has neither."""
        text = json.dumps(obj, indent=indent, sort_keys=indent is not None, allow_nan=False)
        return self._write_atomic(self.path / name, lambda f: f.write(text.encode()))

    def write_table(self, name: str, table: pa.Table) -> Path:
        """Write ``table`` as ``name.parquet``."""
        return self._write_atomic(self.table_path(name), lambda f: pq.write_table(table, f))

    def write_frame(self, name: str, frame: pd.DataFrame, schema: pa.Schema) -> Path:
        """Write a pandas frame as ``name.parquet`` under ``schema`` (columns cast, index dropped)."""
        return self.write_table(name, pa.Table.from_pandas(frame, schema=schema, preserve_index=False))

    def write_part(self, name: str, index: int, table: pa.Table) -> Path:
        return self._write_atomic(self.part_path(name, index), lambda f: pq.write_table(table, f))

    def merge_parts(self, name: str, schema: pa.Schema) -> Path:
        """Merge table ``name``'s parts into ``name.parquet`` (empty with ``schema`` if none), then drop them.

        NOTE: the merged file lands before any part is removed; a crash in between leaves both,
        and readers prefer the merged file.
        """
        parts = self.part_paths(name)

        def write(f: IO[bytes]) -> None:
            with pq.ParquetWriter(f, schema) as writer:
                for part in parts:
                    writer.write_table(pq.read_table(part, schema=schema))
                if not parts:
                    writer.write_table(schema.empty_table())

        path = self._write_atomic(self.table_path(name), write)
        for part in parts:
            part.unlink()
        return path

    def _write_atomic(self, path: Path, write: Callable[[IO[bytes]], object]) -> Path:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path


def json_safe(value: Any) -> Any:
    """NaN and infinity become null (JSON has neither); numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
