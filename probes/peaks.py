"""This machine's peak memory bandwidth and matmul throughput: the roofs a run's steps are measured against.

Measured once before the load starts (``servescope diagnose`` does it before its first server
starts, on a device nobody of ours is using; a measurement under load reads low and puts steps
above the roof), per dtype, and saved in each run directory (``RunDirectory.write_peaks``).

NOTE: a peak is the best the machine was seen to do, so each figure is the best of several
repeats and, for FLOP/s, the best of several GEMM shapes and both ways this engine runs a GEMM
(plain ``torch.mm`` and, on CPU, the oneDNN-prepacked weight the optimized path uses). A step that
still reads above the roof means the peaks were measured low; the report says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CPU_DTYPES = ("float32", "bfloat16")
CUDA_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(slots=True)
class MachinePeaks:
    """Peak memory bandwidth and matmul throughput of this machine's device; the roofs of ``dtype`` on top.

    ``flops_by_dtype`` and ``bandwidth_by_dtype`` hold every dtype measured; ``flops_per_s`` and
    ``bandwidth_bytes_per_s`` are the run's own dtype's.
    """

    device: str
    dtype: str
    bandwidth_bytes_per_s: float  # a large tensor copy: bytes read + written per second
    flops_per_s: float  # the best GEMM in ``dtype``
    measured_at: float
    method: str
    flops_by_dtype: dict[str, float] = field(default_factory=dict)
    bandwidth_by_dtype: dict[str, float] = field(default_factory=dict)
    num_threads: int | None = None  # torch intra-op threads during the measurement (CPU)
    phase: str = "before the load"  # when it was measured, relative to the load

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachinePeaks:
        # NOTE: files written before per-dtype peaks lack the later fields; their defaults hold.
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the bandwidth roof meets the compute roof."""
        return self.flops_per_s / self.bandwidth_bytes_per_s

    def for_dtype(self, dtype: str) -> MachinePeaks:
        """The same measurement with ``dtype``'s roofs on top; a dtype not measured is an error."""
        if dtype not in self.flops_by_dtype:
            raise ValueError(f"no peaks measured for {dtype!r}; measured: {sorted(self.flops_by_dtype)}")
        return dataclasses.replace(self, dtype=dtype, flops_per_s=self.flops_by_dtype[dtype],
                                   bandwidth_bytes_per_s=self.bandwidth_by_dtype[dtype])


def measure_peaks(device: str = "auto", dtype: str = "float32", copy_mib: int | None = None,
                  matmul_n: int | None = None, repeats: int = 5, dtypes: tuple[str, ...] | None = None,
                  num_threads: int | None = None) -> MachinePeaks:
    """Measure peak bandwidth (tensor copy) and FLOP/s (GEMM) on ``device`` for ``dtype`` and ``dtypes``.

    ``matmul_n`` is the largest square GEMM tried (half of it is tried too); ``num_threads`` sets
    torch's intra-op threads for the measurement (the engine's own setting), restored afterwards.
    A few seconds on a CPU.
    """
    import torch

    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       "cpu" if device == "auto" else device)
    is_cuda = dev.type == "cuda"
    wanted = tuple(dict.fromkeys((dtype, *(dtypes if dtypes is not None else native_peak_dtypes(dev)))))
    copy_mib = copy_mib or (1024 if is_cuda else 128)
    matmul_n = matmul_n or (8192 if is_cuda else 2048)
    previous_threads = torch.get_num_threads()
    if num_threads is not None and not is_cuda:
        torch.set_num_threads(num_threads)
    try:
        timer = _Timer(torch, dev, repeats)
        bandwidth = {name: _copy_bandwidth(torch, timer, dev, name, copy_mib) for name in wanted}
        flops = {name: _gemm_flops(torch, timer, dev, name, matmul_n) for name in wanted}
        threads = torch.get_num_threads() if not is_cuda else None
    finally:
        torch.set_num_threads(previous_threads)
    name = torch.cuda.get_device_name(dev) if is_cuda else "cpu"
    sizes = f"{matmul_n // 2}^2 and {matmul_n}^2"
    method = (f"best of {repeats}: copy of {copy_mib} MiB; GEMMs of {sizes}"
              + ("" if is_cuda else ", plain and oneDNN-prepacked") + f"; dtypes {', '.join(wanted)}"
              + (f"; {threads} threads" if threads else ""))
    return MachinePeaks(device=f"{dev} ({name})" if is_cuda else "cpu", dtype=dtype,
                        bandwidth_bytes_per_s=bandwidth[dtype], flops_per_s=flops[dtype], measured_at=time.time(),
                        method=method, flops_by_dtype=flops, bandwidth_by_dtype=bandwidth, num_threads=threads)


def measure_copy_bandwidth(num_threads: int, copy_mib: int = 128, repeats: int = 5) -> float:
    """The CPU's copy bandwidth alone (bytes read + written per second, best of ``repeats``) on ``num_threads``:
    a fraction of a second, for a measurement taken right beside another one."""
    import torch

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        return _copy_bandwidth(torch, _Timer(torch, torch.device("cpu"), repeats), torch.device("cpu"), "float32",
                               copy_mib)
    finally:
        torch.set_num_threads(previous_threads)


def native_peak_dtypes(dev: Any) -> tuple[str, ...]:
    """The dtypes whose peaks are measured by default: those ``dev`` computes natively (a CPU without AVX512-BF16
    or AMX emulates bfloat16 GEMMs, far slower than float32: seconds per GEMM, for a roof no lever on it is
    offered)."""
    from probes.execution_variants import native_dtypes

    native = native_dtypes(dev)
    return tuple(d for d in (CUDA_DTYPES if dev.type == "cuda" else CPU_DTYPES) if d in native)


class _Timer:
    """Best-of-``repeats`` wall time of a callable, synchronizing a CUDA device around it."""

    def __init__(self, torch: Any, dev: Any, repeats: int) -> None:
        self.torch, self.dev, self.repeats = torch, dev, repeats

    def best(self, fn: Callable[[], Any]) -> float:
        is_cuda = self.dev.type == "cuda"
        fn()  # NOTE: the first call pays for allocation and kernel selection
        best = float("inf")
        for _ in range(self.repeats):
            if is_cuda:
                self.torch.cuda.synchronize(self.dev)
            start = time.perf_counter()
            fn()
            if is_cuda:
                self.torch.cuda.synchronize(self.dev)
            best = min(best, time.perf_counter() - start)
        return best


def _torch_dtype(torch: Any, name: str) -> Any:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _copy_bandwidth(torch: Any, timer: _Timer, dev: Any, dtype: str, copy_mib: int) -> float:
    """Bytes read + written per second by one large copy in ``dtype``."""
    torch_dtype = _torch_dtype(torch, dtype)
    num_elements = copy_mib * 2**20 // torch_dtype.itemsize
    if dev.type == "cpu":
        # NOTE: on huge pages, as the engine keeps the weights a decode step streams: on the heap's 4 KiB pages
        # the same copy ran 1.13x slower (2-core EPYC, 2026-12-07), a roof below what the machine gives.
        from engine.cpu_kernels.huge_pages import HugePageArena

        nbytes = num_elements * torch_dtype.itemsize
        src = HugePageArena(nbytes).empty((num_elements,), torch_dtype).fill_(1)
        dst = HugePageArena(nbytes).empty((num_elements,), torch_dtype)
    else:
        src = torch.ones(num_elements, dtype=torch_dtype, device=dev)
        dst = torch.empty_like(src)
    seconds = timer.best(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / seconds


def _gemm_flops(torch: Any, timer: _Timer, dev: Any, dtype: str, matmul_n: int) -> float:
    """The best FLOP/s of square GEMMs of ``matmul_n / 2`` and ``matmul_n``, plain and (CPU) prepacked."""
    from engine.model.projection import packed_or_dense

    torch_dtype = _torch_dtype(torch, dtype)
    best = 0.0
    for n in (matmul_n // 2, matmul_n):
        a = torch.randn(n, n, device=dev).to(torch_dtype)
        b = torch.randn(n, n, device=dev).to(torch_dtype)
        ways: list[Callable[[], Any]] = [lambda a=a, b=b: torch.mm(a, b)]
        if dev.type == "cpu":
            # NOTE: the weight of a projection is [out, in]; x @ w.T is the same n^3 GEMM.
            packed = packed_or_dense(b)
            ways.append(lambda a=a, packed=packed: packed(a))
        with torch.inference_mode():
            for fn in ways:
                best = max(best, 2 * n**3 / timer.best(fn))
    return best
