"""Probes that sample something on their own thread every ``interval_s`` (NVML, host, Prometheus)."""

from __future__ import annotations

import threading
from abc import abstractmethod

from probes.base import Probe
from probes.run_dir import RunDirectory


class SamplerProbe(Probe):
    """Samples once at start, every ``interval_s`` after, and once more at stop.

    :meth:`_open` runs on the caller's thread inside ``start()`` and returns False (after
    :meth:`mark_unavailable`) when there is nothing to sample; the probe then writes an empty
    table and the run goes on. An exception from one sample is counted and the sampling goes on.
    """

    def __init__(self, run_dir: RunDirectory, interval_s: float = 0.5) -> None:
        super().__init__(run_dir)
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self.status.settings["interval_s"] = interval_s
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    def _on_start(self) -> None:
        if not self._open():
            return
        self._sample_safely()
        # NOTE: a daemon thread, so a crashing run is never kept alive by its probes.
        self._thread = threading.Thread(target=self._loop, name=f"probe-{self.name}", daemon=True)
        self._thread.start()

    def _on_stop(self) -> None:
        if self._thread is None:
            return
        self._stop_event.set()
        self._thread.join()
        self._thread = None
        self._sample_safely()
        self._close()

    def _loop(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self._sample_safely()

    def _sample_safely(self) -> None:
        try:
            self._sample()
        except Exception as exc:  # noqa: BLE001 - a failed sample must not end the run
            self.note_error(f"{type(exc).__name__}: {exc}")

    @abstractmethod
    def _open(self) -> bool:
        """Acquire what sampling needs; False when it is unavailable."""

    @abstractmethod
    def _sample(self) -> None:
        """Take one sample and :meth:`_record` its rows."""

    def _close(self) -> None:  # noqa: B027 - an optional hook
        pass
