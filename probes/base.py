"""What every probe is: a named source of rows under a fixed schema, written to the run directory.

A probe buffers rows in memory; ``flush()`` (called by the session every few seconds, from its
own thread) writes what is buffered as a Parquet part file; ``stop()`` flushes the rest and
merges the parts into one ``<table>.parquet``.
"""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from probes.run_dir import RunDirectory


class ProbeState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"


@dataclass(slots=True)
class ProbeStatus:
    """How a probe fared, as recorded in ``run.json``."""

    name: str
    tables: list[str]
    state: ProbeState = ProbeState.CREATED
    is_available: bool = True
    detail: str | None = None  # why it is unavailable, or the first error it met
    num_rows: int = 0
    num_errors: int = 0
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tables": list(self.tables), "state": self.state.value,
                "is_available": self.is_available, "detail": self.detail, "num_rows": self.num_rows,
                "num_errors": self.num_errors, "settings": dict(self.settings)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeStatus:
        return cls(name=data["name"], tables=list(data["tables"]), state=ProbeState(data["state"]),
                   is_available=bool(data["is_available"]), detail=data.get("detail"),
                   num_rows=int(data["num_rows"]), num_errors=int(data.get("num_errors", 0)),
                   settings=dict(data.get("settings", {})))


class Probe(ABC):
    """A probe writing one table, ``name``, under ``schema``.

    Subclasses append rows with :meth:`_record` (or, on a hot path, ``self._rows.append``: cheap
    and thread-safe) and turn a batch of them into an Arrow table in :meth:`_to_table`; they hook
    :meth:`_on_start` / :meth:`_on_stop`.
    """

    name: ClassVar[str]
    schema: ClassVar[pa.Schema]

    def __init__(self, run_dir: RunDirectory) -> None:
        self.run_dir = run_dir
        self.status = ProbeStatus(name=self.name, tables=[self.name])
        # NOTE: deque.append and popleft are atomic, so recording threads never wait on a lock;
        # only the writer (under _write_lock) pops.
        self._rows: deque[Any] = deque()
        # NOTE: held while a part is written so flushes from the session thread and stop() never
        # write the same part index twice or interleave with the merge.
        self._write_lock = threading.Lock()
        self._num_parts = 0

    def start(self) -> None:
        if self.status.state is not ProbeState.CREATED:
            raise RuntimeError(f"probe {self.name!r} was already started")
        self.status.state = ProbeState.RUNNING
        self._on_start()

    def stop(self) -> None:
        """Stop recording, write every remaining row and merge the parts into ``<name>.parquet``."""
        if self.status.state is not ProbeState.RUNNING:
            raise RuntimeError(f"probe {self.name!r} is not running ({self.status.state.value})")
        self._on_stop()
        with self._write_lock:
            self._flush_locked(is_final=True)
            self.run_dir.merge_parts(self.name, self.schema)
            self.status.state = ProbeState.STOPPED

    def flush(self) -> int:
        """Write the rows buffered since the last flush as one part file; returns how many."""
        with self._write_lock:
            if self.status.state is ProbeState.STOPPED:
                return 0
            return self._flush_locked()

    def note_error(self, message: str) -> None:
        """Count an error the probe survived; the first one is kept as the status detail."""
        self.status.num_errors += 1
        if self.status.detail is None:
            self.status.detail = message

    def mark_unavailable(self, reason: str) -> None:
        self.status.is_available = False
        self.status.detail = reason

    # -- for subclasses -----------------------------------------------------------------------
    def _record(self, row: Any) -> None:
        self._rows.append(row)

    def _record_many(self, rows: list[Any]) -> None:
        self._rows.extend(rows)

    def _on_start(self) -> None:  # noqa: B027 - an optional hook
        pass

    def _on_stop(self) -> None:  # noqa: B027 - an optional hook
        pass

    @abstractmethod
    def _to_table(self, rows: list[Any], is_final: bool) -> pa.Table:
        """Rows as recorded -> a table under ``schema``; ``is_final`` on the last call, from ``stop()``.

        Called under the write lock, one call at a time, so it may keep state between calls.
        """

    def _flush_locked(self, is_final: bool = False) -> int:
        popleft = self._rows.popleft
        rows = [popleft() for _ in range(len(self._rows))]
        if not rows and not is_final:
            return 0
        table = self._to_table(rows, is_final)
        if table.num_rows == 0:
            return 0
        self.run_dir.write_part(self.name, self._num_parts, table)
        self._num_parts += 1
        self.status.num_rows += table.num_rows
        return table.num_rows


def columns_table(schema: pa.Schema, columns: dict[str, list[Any]]) -> pa.Table:
    """A table from plain Python column lists, typed by ``schema`` (a missing column is an error)."""
    return pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in schema}, schema=schema)


def tuples_table(schema: pa.Schema, rows: list[tuple[Any, ...]]) -> pa.Table:
    """A table from row tuples whose items follow ``schema``'s column order."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    if len(columns) != len(schema):
        raise ValueError(f"rows have {len(columns)} items, the schema {len(schema)} columns")
    return pa.table([pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)
