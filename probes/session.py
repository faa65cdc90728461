"""A probe session: every probe of one run, started together, flushed on a thread, stopped into a run directory."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from probes.base import Probe
from probes.engine_probe import EngineProbe
from probes.host import HostProbe
from probes.loader import RunData, load_run
from probes.manifest import RunManifest, RunStatus
from probes.model_shape import ModelShape
from probes.nvml import NvmlProbe
from probes.prometheus import PrometheusProbe
from probes.requests import RequestProbe
from probes.run_dir import MANIFEST_NAME, TRACE_NAME, RunDirectory
from probes.steps import StepProbe
from probes.trace import build_trace

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


class ProbeSession:
    """Starts ``probes``, attaches the engine probes to ``engine``, and keeps the run directory current.

    Every ``flush_interval_s`` a thread writes what the probes buffered as part files and rewrites
    ``run.json``, so a run that crashes leaves a directory :func:`~probes.loader.load_run` reads.
    ``stop()`` merges the parts into one Parquet file per table, marks the manifest complete (or
    failed) and writes ``trace.json``.

    NOTE: call ``stop()`` from the thread that drives the engine, or once it has stopped stepping:
    the engine is not thread-safe and the probes are detached from it there.
    """

    def __init__(self, run_dir: RunDirectory, probes: Sequence[Probe], manifest: RunManifest,
                 engine: LLMEngine | None = None, flush_interval_s: float = 1.0) -> None:
        names = [p.name for p in probes]
        if len(set(names)) != len(names):
            raise ValueError(f"probe names must be unique, got {names}")
        if not flush_interval_s > 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s!r}")
        engine_probes = [p for p in probes if isinstance(p, EngineProbe)]
        if engine_probes and engine is None:
            raise ValueError(f"probes {[p.name for p in engine_probes]} observe an engine; pass engine=")
        self.run_dir = run_dir
        self.probes = list(probes)
        self.manifest = manifest
        self.engine = engine
        self.flush_interval_s = flush_interval_s
        # NOTE: the manifest holds the probes' own status objects, so every rewrite shows current counts.
        self.manifest.probes = {p.name: p.status for p in self.probes}
        self._stop_event = threading.Event()
        self._flusher: threading.Thread | None = None
        self._is_stopped = False
        self._flush_error: str | None = None  # the first error the flush thread met
        self._manifest_lock = threading.Lock()

    @classmethod
    def for_engine(cls, engine: LLMEngine, path: str | os.PathLike[str], *, workload: dict[str, Any] | None = None,
                   seeds: dict[str, int] | None = None, prometheus_url: str | None = None,
                   nvml_interval_s: float = 0.2, host_interval_s: float = 0.5,
                   flush_interval_s: float = 1.0) -> ProbeSession:
        """Every probe on ``engine`` (plus Prometheus when ``prometheus_url`` is given) into a new directory."""
        run_dir = RunDirectory.create(path)
        probes: list[Probe] = [StepProbe(run_dir), RequestProbe(run_dir), NvmlProbe(run_dir, nvml_interval_s),
                               HostProbe(run_dir, host_interval_s)]
        if prometheus_url is not None:
            probes.append(PrometheusProbe(run_dir, prometheus_url))
        manifest = RunManifest.collect(
            model=engine.model_name, engine_config=dataclasses.asdict(engine.config), workload=workload,
            seeds={"engine": engine.config.seed, **(seeds or {})}, timers={StepProbe.name: StepProbe.timer},
            model_shape=ModelShape.from_config(engine.model_name, engine.model_config, engine.config.dtype,
                                               engine.decode_weight_bytes()),
        )
        return cls(run_dir, probes, manifest, engine, flush_interval_s)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._flusher is not None:
            raise RuntimeError("the session was already started")
        self.run_dir.path.mkdir(parents=True, exist_ok=True)
        self.manifest.started_at = time.time()
        started: list[Probe] = []
        try:
            for probe in self.probes:
                probe.start()
                started.append(probe)
        except BaseException as exc:
            # NOTE: no sampling thread outlives a failed start; the manifest says what happened.
            for probe in started:
                probe.stop()
            self.manifest.status, self.manifest.error = RunStatus.FAILED, f"start: {type(exc).__name__}: {exc}"
            self._write_manifest()
            raise
        self._write_manifest()
        if self.engine is not None:
            for probe in self.probes:
                if isinstance(probe, EngineProbe):
                    self.engine.add_observer(probe)
        self._flusher = threading.Thread(target=self._flush_loop, name="probe-session-flush", daemon=True)
        self._flusher.start()

    def flush(self) -> None:
        """Write every probe's buffered rows as part files and rewrite ``run.json``."""
        for probe in self.probes:
            try:
                probe.flush()
            except Exception as exc:  # noqa: BLE001 - a failed flush is retried by the next one
                probe.note_error(f"flush: {type(exc).__name__}: {exc}")
        self._write_manifest()

    def stop(self, error: BaseException | None = None) -> RunData:
        """Stop every probe, write the final tables, ``run.json`` and ``trace.json``; returns the run as loaded."""
        if self._flusher is None:
            raise RuntimeError("the session was not started")
        if self._is_stopped:
            raise RuntimeError("the session was already stopped")
        self._is_stopped = True
        self._stop_event.set()
        self._flusher.join()
        if self.engine is not None:
            for probe in self.probes:
                if isinstance(probe, EngineProbe) and probe in self.engine.observers:
                    self.engine.remove_observer(probe)
        failures: list[str] = []
        for probe in self.probes:
            try:
                probe.stop()
            except Exception as exc:  # noqa: BLE001 - every other probe still gets written
                failures.append(f"probe {probe.name}: {type(exc).__name__}: {exc}")
        if self._flush_error is not None:
            failures.insert(0, f"periodic flush: {self._flush_error}")
        if error is not None:
            failures.insert(0, f"{type(error).__name__}: {error}")
        self.manifest.stopped_at = time.time()
        self.manifest.status = RunStatus.FAILED if failures else RunStatus.COMPLETE
        self.manifest.error = "; ".join(failures) or None
        self._write_manifest()
        run = load_run(self.run_dir.path)
        self.run_dir.write_json(TRACE_NAME, build_trace(run), indent=None)
        return run

    def __enter__(self) -> ProbeSession:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(error=exc)

    # -- helpers ------------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while not self._stop_event.wait(self.flush_interval_s):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - keep flushing; stop() reports it
                if self._flush_error is None:
                    self._flush_error = f"{type(exc).__name__}: {exc}"

    def _write_manifest(self) -> None:
        with self._manifest_lock:
            self.run_dir.write_json(MANIFEST_NAME, self.manifest.to_dict())
