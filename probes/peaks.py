"""This machine's peak memory bandwidth and matmul throughput: the roofs a run's steps are measured against.

Measured by the probed server before its engine takes the device (a measurement under load reads
low, and puts steps above the roof), and saved in the run directory (``RunDirectory.write_peaks``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class MachinePeaks:
    """Peak memory bandwidth and matmul throughput, measured on this machine's device."""

    device: str
    dtype: str
    bandwidth_bytes_per_s: float  # a large tensor copy: bytes read + written per second
    flops_per_s: float  # a square matmul in ``dtype``
    measured_at: float
    method: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachinePeaks:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the bandwidth roof meets the compute roof."""
        return self.flops_per_s / self.bandwidth_bytes_per_s



def measure_peaks(device: str = "auto", dtype: str = "float32", copy_mib: int | None = None,
                  matmul_n: int | None = None, repeats: int = 5) -> MachinePeaks:
    """Measure peak bandwidth (tensor copy) and FLOP/s (matmul) on ``device``; about a second on a CPU.

    Takes the best of ``repeats`` timings of each: a peak is what the machine can do, and any
    slower repeat was disturbed by something else.
    """
    import torch

    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       "cpu" if device == "auto" else device)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    is_cuda = dev.type == "cuda"
    copy_mib = copy_mib or (1024 if is_cuda else 128)
    matmul_n = matmul_n or (8192 if is_cuda else 1024)

    def timed(fn: Any) -> float:
        fn()  # NOTE: the first call pays for allocation and kernel selection
        best = float("inf")
        for _ in range(repeats):
            if is_cuda:
                torch.cuda.synchronize(dev)
            start = time.perf_counter()
            fn()
            if is_cuda:
                torch.cuda.synchronize(dev)
            best = min(best, time.perf_counter() - start)
        return best

    num_elements = copy_mib * 2**20 // 4
    src = torch.empty(num_elements, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src))
    bandwidth = 2 * src.numel() * src.element_size() / copy_s
    src = dst = torch.empty(0, device=dev)  # NOTE: frees the copy buffers before the matmul allocates
    a = torch.randn(matmul_n, matmul_n, device=dev).to(torch_dtype)
    b = torch.randn(matmul_n, matmul_n, device=dev).to(torch_dtype)
    matmul_s = timed(lambda: torch.mm(a, b))
    flops = 2 * matmul_n**3 / matmul_s
    name = torch.cuda.get_device_name(dev) if is_cuda else "cpu"
    return MachinePeaks(device=f"{dev} ({name})" if is_cuda else "cpu", dtype=dtype, bandwidth_bytes_per_s=bandwidth,
                        flops_per_s=flops, measured_at=time.time(),
                        method=f"best of {repeats}: copy of {copy_mib} MiB float32; {matmul_n}^2 matmul in {dtype}")

