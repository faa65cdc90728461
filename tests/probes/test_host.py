"""The host probe: this process or another one, and a process that does not exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

from probes.host import HostProbe
from probes.loader import load_table
from probes.run_dir import RunDirectory


def _sample_briefly(run_dir: RunDirectory, pid: int | None = None) -> HostProbe:
    probe = HostProbe(run_dir, interval_s=0.01, pid=pid)
    probe.start()
    probe.stop()
    return probe


def test_samples_this_process_and_every_core(tmp_path: Path) -> None:
    run_dir = RunDirectory.create(tmp_path)
    probe = _sample_briefly(run_dir)
    frame = load_table(run_dir, "host", may_be_partial=False).to_pandas()
    assert probe.status.is_available and probe.status.num_errors == 0
    assert len(frame) >= 2  # at start and at stop
    assert (frame["process_rss_bytes"] > 0).all() and (frame["process_num_threads"] >= 1).all()
    assert all(len(cores) == psutil.cpu_count() for cores in frame["per_core_pct"])
    assert (frame["process_cpu_pct"] >= 0).all()


def test_watches_another_process(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        run_dir = RunDirectory.create(tmp_path)
        probe = _sample_briefly(run_dir, pid=child.pid)
        assert probe.status.settings["pid"] == child.pid and probe.status.num_rows >= 2
    finally:
        child.kill()
        child.wait()


def test_a_missing_process_makes_the_probe_unavailable(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    run_dir = RunDirectory.create(tmp_path)
    probe = _sample_briefly(run_dir, pid=child.pid)
    assert not probe.status.is_available
    assert str(child.pid) in (probe.status.detail or "")
    assert load_table(run_dir, "host", may_be_partial=False).num_rows == 0
