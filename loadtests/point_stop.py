"""When a load point has measured enough: it opens its window once the load is steady, and ends it once
its throughput is known within the target (:class:`loadtests.config.StopRule`), or at its caps.

The orchestrator reads the workers' live counts (each health sample, :mod:`loadtests.client.health`:
content chunks received so far, in-flight requests included, requests in flight, decoding and done)
about once a second and decides:

- **steady**: the first cohort of a closed loop has been replaced (as many requests done as users:
  users that all started at once no longer move in step), and over the last ``STEADY_WINDOW_S`` the
  token rate and the numbers of requests in flight and decoding each agree between the two halves
  within ``STEADY_TOLERANCE`` or within their own noise; or the warm-up cap is reached with the first
  cohort replaced, or ``COHORT_WAIT_FACTOR`` times the cap without (the point says it never steadied);
- **enough**: at least ``MIN_MEASURE_S`` measured and ``MIN_TURNOVERS`` times as many requests done
  in the window as users (fewer, and the batches of the interval would share their requests), and
  the batch-means interval of the token rate (:mod:`reports.capacity.interval`) within the target;
  or the duration cap is reached.

Each decision goes to the workers as a :class:`loadtests.client.point_control.PointControl` whose times lie
ahead (``LEAD_S``) and on whole sub-windows from the window's start. The point's reported interval is
recomputed afterwards from the finished requests' token times (:mod:`reports.capacity.point`); the live
one counts chunks, which are tokens for a server that streams one token per chunk.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.client.point_control import LEAD_S, PointControl
from loadtests.client.records import HEALTH_PREFIX, JOURNAL_SUFFIX, JsonLinesTail
from loadtests.config import COHORT_WAIT_FACTOR, LoadConfig, StopRule
from probes.run_dir import CONTROL_NAME, RunDirectory
from reports.capacity.interval import SUB_WINDOW_S, batch_means_interval

# Seconds of load before anything can be called steady.
MIN_WARMUP_S = 2.0
# The last seconds whose two halves must agree for the load to be steady.
STEADY_WINDOW_S = 6.0
# How far the halves' token rates and decoding counts may differ (share of the larger) and still agree.
STEADY_TOLERANCE = 0.15
# Fewest seconds a point measures, whatever its interval says. NOTE: stopping at the first interval that
# comes out tight favours intervals whose spread was underestimated; with 12 s the interval reported over
# the final window still holds the true rate about 95% of the time (tests/loadtests/test_point_stop.py).
MIN_MEASURE_S = 12.0
# Fewest requests done inside the window, in units of the closed loop's users.
MIN_TURNOVERS = 2
# NOTE (COHORT_WAIT_FACTOR): until as many requests are done as users, every user is still on its first
# request and the mix the load settles to has not begun: over 21 runs of the main job (2026-12-06/07, 2 cores,
# smollm2-135m) that took a median 13, 17, 23 and 26 s at 12, 16, 24 and 32 users (at most 28 s) while the 10 s
# cap opened every such window at 11.6 s, none of them steady, and 24-32-user windows then read 61-66 tok/s
# where the same load gave 70-84 later on.


@dataclass(slots=True)
class LiveCounts:
    """The workers' counts summed at each of ``times`` (each worker's last sample at or before it)."""

    times: np.ndarray
    chunks: np.ndarray
    in_flight: np.ndarray
    decoding: np.ndarray
    done: np.ndarray


class LiveProgress:
    """The workers' health samples with their live counts, read as they are appended (whole lines only)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._tail = JsonLinesTail()
        self._samples: dict[str, list[tuple[float, int, int, int, int]]] = {}

    def poll(self) -> None:
        for sample in self._tail.poll(sorted(self.run_dir.glob(f"{HEALTH_PREFIX}*{JOURNAL_SUFFIX}"))):
            self.add(sample)

    def add(self, sample: dict[str, Any]) -> None:
        """One health sample; those without the load's counts (an older worker) are skipped."""
        if "chunks" not in sample:
            return
        self._samples.setdefault(sample["worker"], []).append(
            (float(sample["time"]), int(sample["chunks"]), int(sample["in_flight"]), int(sample["decoding"]),
             int(sample["done"])))

    @property
    def started_at(self) -> float | None:
        """The first sample of any worker: about when the load started."""
        firsts = [rows[0][0] for rows in self._samples.values() if rows]
        return min(firsts) if firsts else None

    @property
    def known_until(self) -> float | None:
        """The latest time every worker has reported past (the counts are complete up to it)."""
        lasts = [rows[-1][0] for rows in self._samples.values() if rows]
        return min(lasts) if lasts else None

    def at(self, times: np.ndarray) -> LiveCounts:
        total = np.zeros((4, len(times)))
        for rows in self._samples.values():
            table = np.asarray(rows, dtype=float)
            index = np.searchsorted(table[:, 0], times, side="right") - 1
            known = index >= 0
            total[:, known] += table[index[known], 1:].T
        return LiveCounts(times, total[0], total[1], total[2], total[3])


@dataclass(slots=True)
class PointWindow:
    """What a controlled point decided: its window and why it opened and ended there (``load.json``)."""

    measure_from: float | None = None
    stop_at: float | None = None
    why_started: str = ""
    why_stopped: str = ""
    live_interval: dict[str, Any] | None = None  # the interval the stop was decided on (chunks, live)
    is_steady: bool = False  # False: the warm-up cap opened the window, not a steady load

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def control(self) -> PointControl:
        return PointControl(self.measure_from, self.stop_at)


def sub_window_rates(counts: LiveCounts) -> np.ndarray:
    """Token (chunk) rate in each sub-window between consecutive ``counts.times``."""
    return np.diff(counts.chunks) / np.diff(counts.times)


def halves_agree(values: np.ndarray, tolerance: float = STEADY_TOLERANCE) -> bool:
    """Whether the first and the second half of ``values`` have means within ``tolerance`` of the larger, or
    within their own noise (twice the standard error of the difference): no trend that the values can show.

    NOTE: a chat-like load's token rate swings by more than half from one second to the next (prefills
    stall decodes); halves that differ by their noise alone are not a trend."""
    half = len(values) // 2
    if half < 1:
        return False
    a, b = np.asarray(values[:half], dtype=float), np.asarray(values[-half:], dtype=float)
    first, second = float(a.mean()), float(b.mean())
    top = max(abs(first), abs(second))
    noise = 2 * float(np.sqrt((a.var(ddof=1) + b.var(ddof=1)) / half)) if half > 1 else 0.0
    return top == 0 or abs(first - second) <= max(tolerance * top, noise)


@dataclass(slots=True)
class PointMonitor:
    """Decides one point's window from its live counts (see the module docstring)."""

    rule: StopRule
    users: int | None  # closed-loop users; None: an open loop (no cohort, no turnover to wait for)
    warmup_cap_s: float
    duration_cap_s: float
    window: PointWindow = field(default_factory=PointWindow)
    is_done: bool = False  # the window's end is decided (enough measured); nothing changes after

    def decide(self, progress: LiveProgress, now: float) -> PointControl | None:
        """The new control for the workers, or None when nothing changed."""
        start, known = progress.started_at, progress.known_until
        if start is None or known is None or self.is_done:
            return None
        if self.window.measure_from is None:
            why = self._steady(progress, start, known)
            waited = now - start
            replaced = self.users is None or progress.at(np.array([known])).done[-1] >= self.users
            if why is None and (waited < self.warmup_cap_s
                                or (not replaced and waited < COHORT_WAIT_FACTOR * self.warmup_cap_s)):
                return None
            opens = now + LEAD_S
            self.window.measure_from = opens
            self.window.stop_at = opens + self.duration_cap_s
            self.window.is_steady = why is not None
            if why is None and not replaced:
                why = (f"the first {self.users} users' requests were not all replaced within "
                       f"{COHORT_WAIT_FACTOR:g} warm-up caps ({COHORT_WAIT_FACTOR * self.warmup_cap_s:g} s); "
                       f"measured from there, not steady")
            elif why is None:
                why = (f"the load did not steady within the warm-up cap of {self.warmup_cap_s:g} s"
                       + (f" (its first {self.users} users' requests replaced by {waited:.0f} s)"
                          if self.users is not None and waited >= self.warmup_cap_s + 1 else "")
                       + "; measured from there")
            self.window.why_started = why
            self.window.why_stopped = f"reached the duration cap of {self.duration_cap_s:g} s"
            return self.window.control
        assert self.window.stop_at is not None
        if now >= self.window.stop_at:
            self.is_done = True  # NOTE: ran to its cap: the drain after it is no part of the window
            return None
        why = self._enough(progress, known)
        if why is None:
            return None
        assert self.window.measure_from is not None
        num = math.ceil((now + LEAD_S - self.window.measure_from) / SUB_WINDOW_S)
        self.window.stop_at = min(self.window.measure_from + num * SUB_WINDOW_S, self.window.stop_at or math.inf)
        self.window.why_stopped = why
        self.is_done = True
        return self.window.control

    def _steady(self, progress: LiveProgress, start: float, known: float) -> str | None:
        if known - start < max(MIN_WARMUP_S, STEADY_WINDOW_S):
            return None
        counts = progress.at(np.arange(known - STEADY_WINDOW_S, known + 1e-9, SUB_WINDOW_S))
        if self.users is not None and counts.done[-1] < self.users:
            return None
        rates = sub_window_rates(counts)
        # NOTE: in flight matters for an open loop (a server falling behind keeps more and more of them, as
        # GuideLLM's over-saturation check reads it); a closed loop holds its users in flight by construction.
        if not (halves_agree(rates) and halves_agree(counts.decoding[1:]) and halves_agree(counts.in_flight[1:])):
            return None
        cohort = f"{int(counts.done[-1])} requests done (the first {self.users} replaced), " if self.users else ""
        return (f"steady after {known - start:.0f} s: {cohort}token rate, requests in flight and decoding without "
                f"a trend between the halves of the last {STEADY_WINDOW_S:g} s")

    def _enough(self, progress: LiveProgress, known: float) -> str | None:
        assert self.window.measure_from is not None
        num = int(math.floor((known - self.window.measure_from) / SUB_WINDOW_S + 1e-9))
        if num * SUB_WINDOW_S < MIN_MEASURE_S:
            return None
        counts = progress.at(self.window.measure_from + SUB_WINDOW_S * np.arange(num + 1))
        if self.users is not None and counts.done[-1] - counts.done[0] < MIN_TURNOVERS * self.users:
            return None
        interval = batch_means_interval(sub_window_rates(counts))
        if interval is None or interval.relative_half_width > self.rule.target:
            return None
        self.window.live_interval = interval.to_dict()
        return (f"the {interval.confidence:.0%} interval of the live token rate was within "
                f"±{interval.relative_half_width:.1%} (target ±{self.rule.target:.0%}) after {num * SUB_WINDOW_S:g} s")


class PointController:
    """One controlled point as the orchestrator runs it: reads the live counts, decides, tells the workers."""

    def __init__(self, config: LoadConfig, run_dir: Path) -> None:
        assert config.stop_rule is not None
        self.run_dir = run_dir
        self.progress = LiveProgress(run_dir)
        self.monitor = PointMonitor(config.stop_rule, config.users, config.warmup_s, config.duration_s)

    @property
    def window(self) -> PointWindow:
        return self.monitor.window

    def tick(self) -> None:
        self.progress.poll()
        control = self.monitor.decide(self.progress, time.time())
        if control is not None:
            RunDirectory(self.run_dir).save(CONTROL_NAME, control)

    def phase(self, now: float) -> str:
        """What the load is doing now, for the progress bar."""
        w = self.window
        if w.measure_from is None or now < w.measure_from:
            return "warm-up"
        return "measuring" if w.stop_at is None or now < w.stop_at else "draining"

    def finish(self) -> None:
        """The load ended: the control file goes (its window is in ``load.json``)."""
        RunDirectory(self.run_dir).file(CONTROL_NAME).unlink(missing_ok=True)
