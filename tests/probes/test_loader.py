"""The loader: clear errors for missing or corrupt files, and readable crashed runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import LLMEngine
from probes.loader import RunDataError, load_run
from probes.manifest import RunStatus
from probes.session import ProbeSession
from tests.probes.conftest import CompleteRun
from tests.probes.workload import drive, random_prompts

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_copy(complete_run: CompleteRun, tmp_path: Path) -> Path:
    """A copy of the complete run that a test may damage."""
    return Path(shutil.copytree(complete_run.path, tmp_path / "run"))


def test_a_complete_run_loads_every_table(complete_run: CompleteRun) -> None:
    run = load_run(complete_run.path)
    assert run.is_complete
    assert set(run.frames) == {"steps", "requests", "nvml", "host", "prometheus"}
    with pytest.raises(RunDataError, match="no 'gpu' table"):
        run.frame("gpu")


def test_a_directory_without_manifest_is_named(tmp_path: Path) -> None:
    with pytest.raises(RunDataError, match=r"run\.json is missing"):
        load_run(tmp_path)
    with pytest.raises(RunDataError, match="no such directory"):
        load_run(tmp_path / "nope")


def test_a_corrupt_manifest_is_named(run_copy: Path) -> None:
    (run_copy / "run.json").write_text("{ not json")
    with pytest.raises(RunDataError, match=r"run\.json is not readable JSON"):
        load_run(run_copy)
    (run_copy / "run.json").write_text(json.dumps({"format_version": 1}))
    with pytest.raises(RunDataError, match=r"run\.json: the manifest lacks \[.*'engine_config'"):
        load_run(run_copy)


def test_a_missing_table_is_named(run_copy: Path) -> None:
    (run_copy / "steps.parquet").unlink()
    with pytest.raises(RunDataError, match=r"steps\.parquet is missing"):
        load_run(run_copy)


def test_a_corrupt_table_is_named(run_copy: Path) -> None:
    path = run_copy / "requests.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(RunDataError, match=r"requests\.parquet is not a readable Parquet file"):
        load_run(run_copy)


def test_a_table_missing_a_column_or_with_a_wrong_type_is_named(run_copy: Path) -> None:
    path = run_copy / "steps.parquet"
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["forward_s"]), path)
    with pytest.raises(RunDataError, match=r"steps\.parquet lacks the columns \['forward_s'\]"):
        load_run(run_copy)
    index = table.schema.get_field_index("num_seqs")
    pq.write_table(table.set_column(index, "num_seqs", table.column("num_seqs").cast(pa.string())), path)
    with pytest.raises(RunDataError, match=r"steps\.parquet has columns of the wrong type: num_seqs is string"):
        load_run(run_copy)


def test_extra_columns_from_a_newer_writer_are_ignored(run_copy: Path) -> None:
    path = run_copy / "host.parquet"
    table = pq.read_table(path)
    pq.write_table(table.append_column("gpu_temp_c", pa.array([1.0] * table.num_rows)), path)
    assert "gpu_temp_c" not in load_run(run_copy).frame("host").columns


def test_a_run_still_going_loads_what_was_flushed(engine: LLMEngine, tmp_path: Path) -> None:
    session = ProbeSession.for_engine(engine, tmp_path / "run", flush_interval_s=3600)
    session.start()
    try:
        before = load_run(tmp_path / "run")
        assert before.manifest.status is RunStatus.RUNNING and len(before.frame("steps")) == 0
        driven = drive(engine, random_prompts(seed=8, num_prompts=2, length=9), max_tokens=4, prefix="going")
        session.flush()
        during = load_run(tmp_path / "run")
        assert not during.is_complete
        assert len(during.frame("steps")) == driven.num_steps
        assert sorted(during.frame("requests")["request_id"]) == sorted(driven.request_ids)
    finally:
        session.stop()


def test_the_periodic_flush_writes_parts_while_the_run_goes(engine: LLMEngine, tmp_path: Path) -> None:
    session = ProbeSession.for_engine(engine, tmp_path / "run", flush_interval_s=0.01)
    session.start()
    try:
        driven = drive(engine, random_prompts(seed=9, num_prompts=2, length=9), max_tokens=4, prefix="periodic")
        # NOTE: a generous deadline for a busy machine, not a timing assertion: the flusher runs every 10 ms.
        deadline = time.monotonic() + 60
        while len(load_run(tmp_path / "run").frame("steps")) < driven.num_steps:
            assert time.monotonic() < deadline, "the session never flushed the steps"
            time.sleep(0.01)
    finally:
        run = session.stop()
    assert len(run.frame("steps")) == driven.num_steps


CRASHING_RUN = textwrap.dedent("""
    import os, sys
    from engine import EngineConfig, LLMEngine, SamplingParams
    from probes.session import ProbeSession
    engine = LLMEngine(EngineConfig(model="dummy:tiny"))
    session = ProbeSession.for_engine(engine, sys.argv[1], flush_interval_s=3600)
    session.start()
    engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=3, ignore_eos=True), request_id="done")
    while engine.has_unfinished():
        engine.step()
    session.flush()
    print(engine.num_steps, flush=True)
    engine.add_request([9, 10, 11], SamplingParams(max_tokens=50, ignore_eos=True), request_id="lost")
    engine.step()
    os._exit(3)  # a crash: no stop(), no atexit, no finally
""")


def test_a_crashed_run_leaves_a_readable_directory(tmp_path: Path) -> None:
    path = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", CRASHING_RUN, str(path)], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=300, check=False)
    assert done.returncode == 3, done.stderr
    num_flushed_steps = int(done.stdout.split()[-1])
    run = load_run(path)
    assert run.manifest.status is RunStatus.RUNNING and not run.is_complete
    assert len(run.frame("steps")) == num_flushed_steps
    assert run.frame("requests")["request_id"].tolist() == ["done"]
    assert len(run.frame("nvml")) == 0 and not (path / "trace.json").exists()
    assert not [p for p in path.iterdir() if p.name.endswith(".tmp")]
