"""The NVML probe: unavailable without a GPU (with NVML's own words), real readings with one."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from probes.base import ProbeState
from probes.loader import load_table
from probes.nvml import NvmlProbe, query_gpus
from probes.run_dir import RunDirectory
from probes.schemas import NVML


def _nvml_error() -> str | None:
    """NVML's own error text on this machine, or None when it initializes."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return str(exc)
    pynvml.nvmlShutdown()
    return None


NVML_ERROR = _nvml_error()
needs_gpu = pytest.mark.skipif(NVML_ERROR is not None, reason=f"no NVML here: {NVML_ERROR}")
needs_no_gpu = pytest.mark.skipif(NVML_ERROR is None, reason="NVML works here")


@needs_no_gpu
def test_without_nvml_the_probe_is_unavailable_and_writes_an_empty_table(tmp_path: Path) -> None:
    run_dir = RunDirectory.create(tmp_path)
    probe = NvmlProbe(run_dir, interval_s=0.01)
    probe.start()
    probe.stop()
    assert probe.status.state is ProbeState.STOPPED
    assert not probe.status.is_available
    assert probe.status.detail == NVML_ERROR
    table = load_table(run_dir, "nvml", may_be_partial=False)
    assert table.num_rows == 0 and table.schema == NVML


@needs_no_gpu
def test_without_nvml_the_machine_reports_no_gpu_and_why() -> None:
    assert query_gpus() == ([], NVML_ERROR)


@needs_gpu
def test_with_nvml_every_gpu_is_sampled_at_start_and_stop(tmp_path: Path) -> None:
    gpus, reason = query_gpus()
    assert gpus and reason is None
    run_dir = RunDirectory.create(tmp_path)
    probe = NvmlProbe(run_dir, interval_s=0.05)
    probe.start()
    probe.stop()
    frame = load_table(run_dir, "nvml", may_be_partial=False).to_pandas()
    assert probe.status.is_available
    assert set(frame["gpu_index"]) == {g.index for g in gpus}
    assert (frame.groupby("gpu_index").size() >= 2).all()
    assert (frame["mem_total_bytes"] > 0).all()
    assert frame["gpu_util_pct"].between(0, 100).all()
