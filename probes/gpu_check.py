"""On a machine with an NVIDIA GPU: check that the NVML probe reads real utilization that rises under load.

    python -m probes.gpu_check [--out DIR] [--idle-s 3] [--load-s 6]

It samples the GPUs with :class:`~probes.nvml.NvmlProbe` through an idle window and then a window of
back-to-back matmuls (torch on ``cuda:0``), and compares the two. Exit status: 0 passed, 1 failed,
2 nothing to check (no NVML or no CUDA). ``DIR`` gets ``nvml.parquet`` and ``gpu_check.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from probes.loader import load_table
from probes.nvml import NvmlProbe, query_gpus
from probes.run_dir import GPU_CHECK_NAME, RunDirectory

# Passing: the loaded GPU averages at least this busy, and this many points above its idle average.
MIN_LOAD_UTIL_PCT = 50.0
MIN_RISE_PCT = 25.0
RAMP_S = 0.5  # samples this soon after the load starts are left out: utilization is a trailing average


@dataclass(slots=True)
class GpuCheckResult:
    passed: bool
    reason: str
    gpu_index: int | None = None
    idle_util_pct: float | None = None
    load_util_pct: float | None = None
    idle_power_w: float | None = None
    load_power_w: float | None = None
    idle_mem_used_bytes: float | None = None
    load_mem_used_bytes: float | None = None
    num_idle_samples: int = 0
    num_load_samples: int = 0
    num_matmuls: int = 0


def run_check(out: Path, idle_s: float = 3.0, load_s: float = 6.0, interval_s: float = 0.1,
              matmul_size: int = 8192) -> GpuCheckResult | None:
    """Run the idle / load windows and judge them; ``None`` when there is no GPU to check."""
    import torch  # NOTE: imported here so `--help` and the no-GPU path stay light.

    gpus, reason = query_gpus()
    if not gpus or not torch.cuda.is_available():
        print(f"nothing to check: NVML: {reason or 'ok'}; CUDA available: {torch.cuda.is_available()}")
        return None
    device = torch.device("cuda:0")
    a = torch.randn(matmul_size, matmul_size, device=device, dtype=torch.float16)
    b = torch.randn(matmul_size, matmul_size, device=device, dtype=torch.float16)
    (a @ b).sum().item()  # NOTE: CUDA and cuBLAS start-up happen before the idle window.
    torch.cuda.synchronize()
    time.sleep(1.0)

    run_dir = RunDirectory.create(out)
    probe = NvmlProbe(run_dir, interval_s=interval_s)
    probe.start()
    idle = (time.time(), time.time() + idle_s)
    time.sleep(idle_s)
    load_start = time.time()
    num_matmuls = 0
    while time.time() < load_start + load_s:
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()
        num_matmuls += 8
    load = (load_start + RAMP_S, time.time())
    probe.stop()
    frame = load_table(run_dir, "nvml", may_be_partial=False).to_pandas()
    result = judge(frame, idle, load)
    result.num_matmuls = num_matmuls
    run_dir.write_json(GPU_CHECK_NAME, {**dataclasses.asdict(result), "gpus": [g.name for g in gpus],
                                          "nvml_status": probe.status.to_dict()})
    return result


def judge(frame: pd.DataFrame, idle: tuple[float, float], load: tuple[float, float]) -> GpuCheckResult:
    """Compare each GPU's idle and load windows; the GPU that got the load is the busiest one under it."""
    if frame.empty:
        return GpuCheckResult(False, "the NVML probe recorded no samples")
    in_idle = frame[frame["time"].between(*idle)]
    in_load = frame[frame["time"].between(*load)]
    if in_idle.empty or in_load.empty:
        return GpuCheckResult(False, f"too few samples: {len(in_idle)} idle, {len(in_load)} under load")
    load_means = in_load.groupby("gpu_index")["gpu_util_pct"].mean()
    gpu = int(load_means.idxmax())
    idle_gpu, load_gpu = in_idle[in_idle["gpu_index"] == gpu], in_load[in_load["gpu_index"] == gpu]
    idle_util, load_util = float(idle_gpu["gpu_util_pct"].mean()), float(load_gpu["gpu_util_pct"].mean())
    passed = load_util >= MIN_LOAD_UTIL_PCT and load_util - idle_util >= MIN_RISE_PCT
    reason = (f"GPU {gpu}: utilization {idle_util:.0f}% idle -> {load_util:.0f}% under load "
              f"(needs >= {MIN_LOAD_UTIL_PCT:.0f}% and a rise of >= {MIN_RISE_PCT:.0f} points)")
    return GpuCheckResult(
        passed, reason, gpu, idle_util, load_util, _mean(idle_gpu["power_w"]), _mean(load_gpu["power_w"]),
        _mean(idle_gpu["mem_used_bytes"]), _mean(load_gpu["mem_used_bytes"]), len(idle_gpu), len(load_gpu),
    )


def _mean(column: pd.Series) -> float | None:
    return None if column.isna().all() else float(column.mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="directory for nvml.parquet and gpu_check.json")
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--load-s", type=float, default=6.0)
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="servescope-gpu-check-"))
    result = run_check(out, idle_s=args.idle_s, load_s=args.load_s)
    if result is None:
        return 2
    print(json.dumps(dataclasses.asdict(result), indent=2))
    print(("PASS: " if result.passed else "FAIL: ") + result.reason + f" (files in {out})")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
