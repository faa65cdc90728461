"""What the run ran on: CPU, memory, GPUs and driver, the Python stack's versions."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from probes.nvml import GpuInfo, query_gpus

# Distributions whose versions go into run.json (import names differ for some: nvidia-ml-py is pynvml).
RECORDED_DISTRIBUTIONS = ("torch", "triton", "numpy", "pandas", "pyarrow", "psutil", "nvidia-ml-py",
                          "prometheus-client")


@dataclass(slots=True)
class MachineInfo:
    """The host and its accelerators; ``gpu_unavailable_reason`` holds NVML's error text when it has none."""

    platform: str
    python: str
    cpu_model: str | None
    num_cpu_cores_physical: int | None
    num_cpu_cores_logical: int | None
    memory_total_bytes: int
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_unavailable_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform, "python": self.python, "cpu_model": self.cpu_model,
            "num_cpu_cores_physical": self.num_cpu_cores_physical,
            "num_cpu_cores_logical": self.num_cpu_cores_logical,
            "memory_total_bytes": self.memory_total_bytes,
            "gpus": [{"index": g.index, "name": g.name, "driver_version": g.driver_version,
                      "memory_total_bytes": g.memory_total_bytes} for g in self.gpus],
            "gpu_unavailable_reason": self.gpu_unavailable_reason,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineInfo:
        return cls(
            platform=data["platform"], python=data["python"], cpu_model=data["cpu_model"],
            num_cpu_cores_physical=data["num_cpu_cores_physical"],
            num_cpu_cores_logical=data["num_cpu_cores_logical"], memory_total_bytes=data["memory_total_bytes"],
            gpus=[GpuInfo(**g) for g in data["gpus"]], gpu_unavailable_reason=data["gpu_unavailable_reason"],
        )

    @classmethod
    def collect(cls) -> MachineInfo:
        gpus, reason = query_gpus()
        return cls(
            platform=platform.platform(), python=platform.python_version(), cpu_model=cpu_model(),
            num_cpu_cores_physical=psutil.cpu_count(logical=False), num_cpu_cores_logical=psutil.cpu_count(),
            memory_total_bytes=psutil.virtual_memory().total, gpus=gpus, gpu_unavailable_reason=reason,
        )


def cpu_model() -> str | None:
    """The CPU's marketing name where the OS tells it (``platform.processor()`` is empty on Linux)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    return platform.processor() or None


def software_versions() -> dict[str, str | None]:
    """Installed versions of :data:`RECORDED_DISTRIBUTIONS` (``None`` when one is not installed)."""
    versions: dict[str, str | None] = {}
    for name in RECORDED_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
