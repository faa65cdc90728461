"""GPU utilization, memory, power and SM clock sampled through NVML.

``pynvml`` is the module that the ``nvidia-ml-py`` distribution provides (NVIDIA's own bindings);
the separate ``pynvml`` distribution is a deprecated redirect that warns on import.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pynvml

from probes import schemas
from probes.base import tuples_table
from probes.run_dir import RunDirectory
from probes.sampler import SamplerProbe


@dataclass(slots=True)
class GpuInfo:
    index: int
    name: str
    driver_version: str
    memory_total_bytes: int


def query_gpus() -> tuple[list[GpuInfo], str | None]:
    """The GPUs NVML sees and the driver version, or ``([], NVML's error text)`` without one."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], str(exc)
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(GpuInfo(index, _text(pynvml.nvmlDeviceGetName(handle)), driver,
                                int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
        return gpus, None if gpus else "NVML found no GPU"
    except pynvml.NVMLError as exc:
        return [], str(exc)
    finally:
        pynvml.nvmlShutdown()


class NvmlProbe(SamplerProbe):
    """One row per GPU per sample: utilization (GPU and memory), memory used / total, power, SM clock.

    Without NVML (no driver, no GPU) ``start()`` records the probe as unavailable with NVML's own
    error text as the detail, writes an empty table, and the run goes on. A reading the device
    does not support (power on some boards) is null, its error noted once.
    """

    name = "nvml"
    schema = schemas.NVML

    def __init__(self, run_dir: RunDirectory, interval_s: float = 0.2) -> None:
        super().__init__(run_dir, interval_s)
        self._handles: list[Any] = []
        self._failed_fields: set[str] = set()

    def _open(self) -> bool:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.mark_unavailable(str(exc))
            return False
        try:
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            self.mark_unavailable(str(exc))
            return False
        if not self._handles:
            pynvml.nvmlShutdown()
            self.mark_unavailable("NVML found no GPU")
            return False
        self.status.settings["num_gpus"] = len(self._handles)
        return True

    def _close(self) -> None:
        self._handles = []
        pynvml.nvmlShutdown()

    def _sample(self) -> None:
        now = time.time()
        for index, handle in enumerate(self._handles):
            util = self._read("utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._read("memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = self._read("power", pynvml.nvmlDeviceGetPowerUsage, handle)
            sm_clock = self._read("sm_clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            self._record((
                now, index,
                None if util is None else float(util.gpu), None if util is None else float(util.memory),
                None if memory is None else int(memory.used), None if memory is None else int(memory.total),
                None if power_mw is None else power_mw / 1000.0,
                None if sm_clock is None else float(sm_clock),
            ))

    def _read(self, field: str, query: Callable[..., Any], *args: Any) -> Any:
        try:
            return query(*args)
        except pynvml.NVMLError as exc:
            if field not in self._failed_fields:
                self._failed_fields.add(field)
                self.note_error(f"{field}: {exc}")
            return None

    def _to_table(self, rows: list[tuple[Any, ...]], is_final: bool) -> pa.Table:
        return tuples_table(self.schema, rows)


def _text(value: str | bytes) -> str:
    # NOTE: older nvidia-ml-py releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value
