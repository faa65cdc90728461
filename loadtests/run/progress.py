"""The terminal while a load runs (a live line per point, fed by the workers' journals and /metrics) and after."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from loadtests.client.records import ClientRecord, JsonLinesTail, journal_paths
from probes.run_dir import WORKERS_NAME, RunDirectory, RunFileError, WorkerRoster

RECENT_WINDOW_S = 5.0
GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
          "vllm:kv_cache_usage_perc": "kv"}


class JournalTail:
    """Reads what the workers appended to their journals since the last poll (whole lines only)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._tail = JsonLinesTail()

    def poll(self) -> list[ClientRecord]:
        return [ClientRecord.from_dict(line) for line in self._tail.poll(journal_paths(self.run_dir))]


class LiveCounts:
    """Running counts of one point, and what finished in the last few seconds."""

    def __init__(self) -> None:
        self.num_ok = 0
        self.num_failed = 0
        self.num_warmup = 0
        self.num_retried = 0  # sent again: the pooled connection closed before any answer
        self._recent: deque[tuple[float, int]] = deque()  # (end time, output tokens)
        self._ttfts: deque[float] = deque(maxlen=200)

    def add(self, records: list[ClientRecord]) -> None:
        for record in records:
            self.num_retried += bool(record.num_retries)
            if record.is_warmup:
                self.num_warmup += 1
            elif record.is_ok:
                self.num_ok += 1
            else:
                self.num_failed += 1
            if record.is_ok and record.end_time is not None:
                self._recent.append((record.end_time, record.num_output_tokens or 0))
                if record.ttft_s is not None:
                    self._ttfts.append(record.ttft_s)

    def output_tokens_per_s(self, now: float) -> float:
        while self._recent and self._recent[0][0] < now - RECENT_WINDOW_S:
            self._recent.popleft()
        return sum(n for _, n in self._recent) / RECENT_WINDOW_S

    def recent_ttft_p50_s(self) -> float | None:
        if not self._ttfts:
            return None
        ordered = sorted(self._ttfts)
        return ordered[len(ordered) // 2]


def scrape_gauges(metrics_url: str) -> dict[str, float]:
    """The queue and KV gauges of a vLLM-style /metrics endpoint; empty when it does not answer."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=1.0) as response:  # noqa: S310 - http(s) URL we were given
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError):
        return {}
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in GAUGES:
                    out[GAUGES[sample.name]] = out.get(GAUGES[sample.name], 0.0) + float(sample.value)
    except ValueError:
        return {}
    return out


class LoadProgress:
    """A progress bar for one load point: phase, elapsed, requests, output tok/s, TTFT, server queue."""

    def __init__(self, console: Console, point: str, run_dir: Path, warmup_s: float, duration_s: float,
                 metrics_url: str | None = None, phase: Callable[[float], str] | None = None) -> None:
        self.point = point
        self.phase = phase  # a controlled point's phase at a time (its window is decided as it runs)
        self.warmup_s = warmup_s
        self.duration_s = duration_s
        self.metrics_url = metrics_url
        self.tail = JournalTail(run_dir)
        self.counts = LiveCounts()
        self._console = console
        self._last = ("starting", "")  # the last phase and description, printed whole at the end off a terminal
        self._progress = Progress(TextColumn("[bold]{task.fields[point]}"), BarColumn(),
                                  TextColumn("{task.fields[phase]}"), TimeElapsedColumn(),
                                  TextColumn("{task.description}"), console=console, transient=False)
        self._task = self._progress.add_task("", total=warmup_s + duration_s, point=point, phase="starting")

    def tick(self, elapsed_s: float) -> None:
        self.counts.add(self.tail.poll())
        roster = self._roster()
        if roster is not None and roster.started_at is None:
            self._progress.update(self._task, completed=0, phase="waiting",
                                  description=f"{len(roster.workers)} of {roster.num_expected} workers joined")
            return
        if roster is not None and roster.started_at is not None:
            elapsed_s = time.time() - roster.started_at  # NOTE: the load starts once every worker joined
        if self.phase is not None:
            phase = self.phase(time.time())
        elif elapsed_s < self.warmup_s:
            phase = "warm-up"
        elif elapsed_s < self.warmup_s + self.duration_s:
            phase = "measuring"
        else:
            phase = "draining"
        ttft = self.counts.recent_ttft_p50_s()
        parts = [f"{self.counts.num_ok} ok", f"{self.counts.num_failed} failed",
                 *([f"{self.counts.num_retried} retried"] if self.counts.num_retried else []),
                 f"{self.counts.output_tokens_per_s(time.time()):.0f} out tok/s",
                 f"TTFT p50 {ttft * 1000:.0f} ms" if ttft is not None else "TTFT -"]
        if self.metrics_url is not None:
            gauges = scrape_gauges(self.metrics_url)
            if gauges:
                parts.append(f"server {gauges.get('running', 0):.0f} running / {gauges.get('waiting', 0):.0f} waiting"
                             f" / KV {gauges.get('kv', 0) * 100:.0f}%")
        self._last = (phase, " | ".join(parts))
        self._progress.update(self._task, completed=min(elapsed_s, self.warmup_s + self.duration_s), phase=phase,
                              description=self._last[1])

    def _roster(self) -> WorkerRoster | None:
        """The Locust master's roster (a run with workers), or None; a half-written one counts as absent."""
        try:
            return RunDirectory(self.tail.run_dir).load(WORKERS_NAME, WorkerRoster)
        except RunFileError:
            return None

    def __enter__(self) -> LoadProgress:
        if self._console.is_terminal:
            self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._console.is_terminal:
            self._progress.stop()
        else:
            # NOTE: off a terminal (a log, a pipe) a bar is never redrawn and rich would cut the line to 80
            # columns: one plain line instead, wrapped where it is long.
            self._console.print(f"{self.point}: {' | '.join(self._last)}", highlight=False, markup=False)

