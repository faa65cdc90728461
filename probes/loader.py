"""Read a run directory back into pandas frames, checking every file against its schema.

Reports read runs only through :func:`load_run`. A run that crashed loads too: a table whose
probe never stopped is read from its part files (or is empty when none was flushed yet).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from probes.base import ProbeState
from probes.manifest import ManifestError, RunManifest, RunStatus
from probes.run_dir import RunDirectory
from probes.schemas import TABLE_SCHEMAS


class RunDataError(Exception):
    """A run directory that cannot be read; the message names the file and what is wrong with it."""


@dataclass(slots=True)
class RunData:
    """One run: its manifest and one frame per table its probes wrote (``steps``, ``requests``, ...)."""

    path: Path
    manifest: RunManifest
    frames: dict[str, pd.DataFrame]

    @property
    def is_complete(self) -> bool:
        return self.manifest.status is RunStatus.COMPLETE

    def frame(self, name: str) -> pd.DataFrame:
        """The frame of table ``name``; a clear error when the run has no such table."""
        if name not in self.frames:
            raise RunDataError(f"{self.path}: this run has no {name!r} table (it has {sorted(self.frames)}); "
                               f"was the {name} probe enabled?")
        return self.frames[name]


def load_run(path: str | os.PathLike[str]) -> RunData:
    """Load the run directory at ``path``; raises :class:`RunDataError` for a missing or corrupt file."""
    run_dir = RunDirectory(path)
    if not run_dir.path.is_dir():
        raise RunDataError(f"{run_dir.path}: no such directory")
    manifest = load_manifest(run_dir)
    frames: dict[str, pd.DataFrame] = {}
    for probe in manifest.probes.values():
        for table_name in probe.tables:
            table = load_table(run_dir, table_name, may_be_partial=probe.state is not ProbeState.STOPPED)
            frames[table_name] = table.to_pandas()
    return RunData(run_dir.path, manifest, frames)


def load_manifest(run_dir: RunDirectory) -> RunManifest:
    path = run_dir.manifest_path
    if not path.is_file():
        raise RunDataError(f"{path} is missing: {run_dir.path} is not a run directory, or its run never started")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunDataError(f"{path} is not readable JSON: {exc}") from exc
    try:
        return RunManifest.from_dict(data)
    except ManifestError as exc:
        raise RunDataError(f"{path}: {exc}") from exc


def load_table(run_dir: RunDirectory, name: str, may_be_partial: bool) -> pa.Table:
    """Table ``name`` from its merged file, else from its parts when ``may_be_partial`` (a run still going)."""
    schema = TABLE_SCHEMAS.get(name)
    if schema is None:
        raise RunDataError(f"{run_dir.manifest_path} lists a table {name!r} this servescope does not know "
                           f"(known: {sorted(TABLE_SCHEMAS)})")
    merged = run_dir.table_path(name)
    if merged.is_file():
        return _read_checked(merged, schema)
    if not may_be_partial:
        raise RunDataError(f"{merged} is missing, though {run_dir.manifest_path} says its probe stopped and wrote it")
    parts = [_read_checked(part, schema) for part in run_dir.part_paths(name)]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _read_checked(path: Path, schema: pa.Schema) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise RunDataError(f"{path} is not a readable Parquet file: {exc}") from exc
    missing = [name for name in schema.names if name not in table.schema.names]
    if missing:
        raise RunDataError(f"{path} lacks the columns {missing}")
    wrong = [f"{f.name} is {table.schema.field(f.name).type}, expected {f.type}" for f in schema
             if not _is_compatible(table.schema.field(f.name).type, f.type)]
    if wrong:
        raise RunDataError(f"{path} has columns of the wrong type: {'; '.join(wrong)}")
    # NOTE: extra columns (written by a newer servescope) are dropped; an all-null column may be typed null.
    return table.select(schema.names).cast(schema)


def _is_compatible(found: pa.DataType, expected: pa.DataType) -> bool:
    return found == expected or pa.types.is_null(found)
