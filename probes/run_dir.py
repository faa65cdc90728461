"""The run directory on disk: atomic writes, Parquet part files while a run goes, one file per table after.

Layout::

    run.json                      the manifest (probes.manifest.RunManifest)
    steps.parquet, requests.parquet, nvml.parquet, host.parquet, prometheus.parquet
    steps.part-000000.parquet     parts a probe flushed while running; merged into steps.parquet on stop
    trace.json                    Chrome / Perfetto trace

NOTE: every file appears only through a temp file + ``os.replace``, so a reader (or a run that
crashed) never sees half a file: each name holds either nothing or a complete file. Temp files start
with a dot and end in ``.tmp``; readers ignore them.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST_NAME = "run.json"
TRACE_NAME = "trace.json"
PARQUET_SUFFIX = ".parquet"
PART_INFIX = ".part-"


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
