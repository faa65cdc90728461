"""Run directory writes: atomic replacement, part files merged in order, nothing half-written left."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from probes.run_dir import RunDirectory
from probes.schemas import HOST


def _host_rows(start: float, n: int) -> pa.Table:
    return pa.table({"time": [start + i for i in range(n)], "process_cpu_pct": [1.0] * n,
                     "process_rss_bytes": [10] * n, "process_num_threads": [1] * n, "system_cpu_pct": [2.0] * n,
                     "per_core_pct": [[2.0, 2.0]] * n}, schema=HOST)


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temp(tmp_path: Path) -> None:
    run_dir = RunDirectory.create(tmp_path)
    run_dir.write_json("run.json", {"a": 1})
    with pytest.raises(ValueError, match="JSON compliant"):
        run_dir.write_json("run.json", {"a": float("nan")})
    assert (tmp_path / "run.json").read_text() == '{\n  "a": 1\n}'
    # A merge that fails halfway through writing (a part is unreadable) keeps the old table and the parts.
    run_dir.write_table("host", _host_rows(start=0, n=1))
    run_dir.write_part("host", 0, _host_rows(start=10, n=2))
    run_dir.part_path("host", 1).write_bytes(b"PAR1 not really parquet")
    with pytest.raises(pa.ArrowException):
        run_dir.merge_parts("host", HOST)
    assert pq.read_table(run_dir.table_path("host")).column("time").to_pylist() == [0.0]
    assert len(run_dir.part_paths("host")) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_parts_merge_in_write_order_into_one_file(tmp_path: Path) -> None:
    run_dir = RunDirectory.create(tmp_path)
    for index in range(12):  # past 10, where unpadded names would sort out of order
        run_dir.write_part("host", index, _host_rows(start=index * 100, n=2))
    assert len(run_dir.part_paths("host")) == 12
    run_dir.merge_parts("host", HOST)
    assert run_dir.part_paths("host") == []
    times = pq.read_table(run_dir.table_path("host")).column("time").to_pylist()
    assert times == sorted(times) and len(times) == 24


def test_merging_no_parts_writes_an_empty_table_with_the_schema(tmp_path: Path) -> None:
    run_dir = RunDirectory.create(tmp_path)
    run_dir.merge_parts("host", HOST)
    table = pq.read_table(run_dir.table_path("host"))
    assert table.num_rows == 0 and table.schema == HOST


def test_create_refuses_a_directory_with_a_run_in_it(tmp_path: Path) -> None:
    RunDirectory.create(tmp_path).write_json("run.json", {})
    with pytest.raises(FileExistsError, match="already holds a run"):
        RunDirectory.create(tmp_path)
