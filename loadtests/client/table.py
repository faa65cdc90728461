"""``client_requests.parquet``: every worker's client rows merged, with the latencies derived once, here;
and ``client_health.parquet``, every worker's health samples (:mod:`loadtests.client.health`)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from loadtests.client.records import (
    HEALTH_PREFIX,
    JOURNAL_SUFFIX,
    ClientRecord,
    journal_paths,
    read_journal,
    read_json_lines,
)
from probes.run_dir import CLIENT_HEALTH_TABLE, CLIENT_TABLE, WORKERS_NAME, RunDirectory, WorkerRoster
from probes.schemas import CLIENT_HEALTH, CLIENT_REQUESTS


def records_table(records: list[ClientRecord]) -> pa.Table:
    columns: dict[str, list[object]] = {name: [] for name in CLIENT_REQUESTS.names}
    for record in records:
        for name in CLIENT_REQUESTS.names:
            columns[name].append(getattr(record, name))
    return pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in CLIENT_REQUESTS},
                    schema=CLIENT_REQUESTS)


def merge_journals(run_dir: str | os.PathLike[str], remove: bool = True) -> Path:
    """Merge every worker's journal into ``client_requests.parquet``, sorted by send time.

    NOTE: the merged file lands (atomically) before any journal is removed. The workers' health
    journals are merged alongside (:func:`merge_health_journals`).
    """
    merge_health_journals(run_dir, remove)
    paths = journal_paths(run_dir)
    records = [record for path in paths for record in read_journal(path)]
    records.sort(key=lambda r: (r.send_time, r.worker, r.seq))
    out = RunDirectory(run_dir).write_table(CLIENT_TABLE, records_table(records))
    if remove:
        for path in paths:
            path.unlink()
    return out


def merge_health_journals(run_dir: str | os.PathLike[str], remove: bool = True) -> Path | None:
    """Every worker's health samples into ``client_health.parquet`` (None when no worker wrote any)."""
    paths = sorted(Path(run_dir).glob(f"{HEALTH_PREFIX}*{JOURNAL_SUFFIX}"))
    if not paths:
        return None
    samples = sorted((s for path in paths for s in read_json_lines(path)), key=lambda s: (s["time"], s["worker"]))
    table = pa.table({f.name: pa.array([s[f.name] for s in samples], type=f.type) for f in CLIENT_HEALTH},
                     schema=CLIENT_HEALTH)
    out = RunDirectory(run_dir).write_table(CLIENT_HEALTH_TABLE, table)
    if remove:
        for path in paths:
            path.unlink()
    return out


def take_worker_roster(run_dir: str | os.PathLike[str]) -> WorkerRoster | None:
    """The Locust master's ``workers.json`` (None without a master), removed: its workers go into ``load.json``."""
    directory = RunDirectory(run_dir)
    roster = directory.load(WORKERS_NAME, WorkerRoster)
    directory.file(WORKERS_NAME).unlink(missing_ok=True)
    return roster


def load_client_requests(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """The merged client rows of a run directory."""
    path = RunDirectory(run_dir).table_path(CLIENT_TABLE)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: no load was run into {run_dir}, or it was not merged")
    return pq.read_table(path, schema=CLIENT_REQUESTS).to_pandas()
