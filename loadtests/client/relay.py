"""What travels between a Locust master and its workers besides Locust's own stats: the plan out, the rows back.

A master's workers may run on other machines (``servescope worker``), so nothing of a run goes
through the run directory's disk but the master's:

- When a test starts, the master sends the plan (``workload.jsonl``, compressed) to every worker
  (:data:`PLAN_MESSAGE`). NOTE: it goes out before Locust's own spawn message, over the same
  connection, so a worker holds the plan by the time its users start. The rest of the run's
  settings (target, seed, rate, warm-up, ...) reach the workers as Locust's parsed options.
- Each worker sends its client rows and health samples back in batches (:data:`ROWS_MESSAGE`,
  :class:`RowRelay`): every ``FLUSH_INTERVAL_S`` or ``MAX_BATCH_LINES`` lines, whichever comes
  first, so a worker that dies takes with it only its last fraction of a second and what it had
  in flight. The master appends them to the same per-worker journals a lone process writes
  (:mod:`loadtests.client.collector`), so the merge into ``client_requests.parquet`` is the same.
- When a worker has sent its last row it says so (:data:`DONE_MESSAGE`), with its counts.

Light on purpose (stdlib, gevent): Locust's processes import it.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent

from loadtests.plan import PlannedRequest, parse_plan

logger = logging.getLogger(__name__)

PLAN_MESSAGE = "servescope_plan"
ROWS_MESSAGE = "servescope_rows"
DONE_MESSAGE = "servescope_worker_done"
# The kinds of line a worker sends: its client rows, and its health samples (loadtests.client.health).
REQUESTS, HEALTH = "requests", "health"
LINE_KINDS = (REQUESTS, HEALTH)
# A batch goes out this often, or as soon as it holds this many lines.
FLUSH_INTERVAL_S = 0.5
MAX_BATCH_LINES = 256

Send = Callable[[str, dict[str, Any]], None]  # a runner's send_message


def encode_plan(path: Path) -> dict[str, Any]:
    """The plan message's data: the plan file's bytes, compressed (prompts are text; they shrink well)."""
    return {"plan": zlib.compress(path.read_bytes())}


def decode_plan(data: dict[str, Any]) -> list[PlannedRequest]:
    return parse_plan(zlib.decompress(data["plan"]).decode("utf-8"), "the plan the master sent")


class RowRelay:
    """One worker's lines on their way to its master, in batches (see the module docstring).

    ``count_started`` says how many requests the worker has sent so far (journaled or in flight);
    each batch carries it, so the master knows what a worker that then dies had in flight.
    """

    def __init__(self, send: Send, worker: str, interval_s: float = FLUSH_INTERVAL_S,
                 max_lines: int = MAX_BATCH_LINES) -> None:
        self.worker = worker
        self.count_started: Callable[[], int] = lambda: 0
        self.num_sent = dict.fromkeys(LINE_KINDS, 0)
        self.is_done = False
        self._send = send
        self._interval_s = interval_s
        self._max_lines = max_lines
        self._pending: dict[str, list[str]] = {kind: [] for kind in LINE_KINDS}
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._run)

    def lines(self, kind: str) -> RelayLines:
        """A line sink (:class:`loadtests.client.records.LineSink`) whose lines go to the master as ``kind``."""
        if kind not in LINE_KINDS:
            raise ValueError(f"unknown line kind {kind!r}; known: {', '.join(LINE_KINDS)}")
        return RelayLines(self, kind)

    def add(self, kind: str, line: str) -> None:
        self._pending[kind].append(line)
        if sum(len(lines) for lines in self._pending.values()) >= self._max_lines:
            self.flush()

    def flush(self) -> None:
        """Send what is pending as one batch; on a send error it stays pending for the next try."""
        if not any(self._pending.values()):
            return
        batch, self._pending = self._pending, {kind: [] for kind in LINE_KINDS}
        try:
            self._send(ROWS_MESSAGE, {"worker": self.worker, "lines": batch, "num_started": self.count_started()})
        except Exception as exc:  # noqa: BLE001 - Locust's RPC errors; the master may come back
            logger.warning("servescope: sending %s's rows to the master failed (%s); retrying", self.worker, exc)
            for kind, lines in batch.items():
                self._pending[kind][:0] = lines
            return
        for kind, lines in batch.items():
            self.num_sent[kind] += len(lines)

    def done(self, ended_itself: bool) -> None:
        """Flush, then tell the master every row so far is sent (``ended_itself``: the load reached its end)."""
        self.flush()
        self._send(DONE_MESSAGE, {"worker": self.worker, "num_rows": self.num_sent[REQUESTS],
                                  "num_started": self.count_started(), "ended_itself": ended_itself})
        self.is_done = True

    def close(self) -> None:
        """Stop the timer and send what is left."""
        if self._greenlet is not None:
            self._greenlet.kill()
            self._greenlet = None
        self.flush()

    def _run(self) -> None:
        # NOTE: runs until close() (the worker's test_stop); the worker itself ends with its master.
        while True:
            gevent.sleep(self._interval_s)
            self.flush()


class RelayLines:
    """The lines of one kind a :class:`RowRelay` carries; closing it leaves the relay open (it closes at test_stop)."""

    def __init__(self, relay: RowRelay, kind: str) -> None:
        self._relay = relay
        self._kind = kind

    def write_line(self, line: str) -> None:
        self._relay.add(self._kind, line)

    def close(self) -> None:
        return None
