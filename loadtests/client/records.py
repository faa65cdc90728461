"""Client-side rows, one per request, as each Locust worker journals them: ``client_requests-<worker>.jsonl``.

Light on purpose (stdlib only): Locust's processes import it. A lone Locust process writes its
journal into the run directory itself; the workers of a master send their lines to it, and it
appends them to the same files (:mod:`loadtests.client.relay`). The orchestrator merges the per-worker
journals into ``client_requests.parquet`` (see :mod:`loadtests.client.table`).

Times are seconds since the epoch from :class:`Clock`: ``time.time()`` at the clock's creation
plus ``time.perf_counter()`` since, so they line up with the server's probes (``time.time()``)
yet never step backwards inside a run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

JOURNAL_PREFIX = "client_requests-"
JOURNAL_SUFFIX = ".jsonl"
# Each worker's health samples (loadtests.client.health), merged beside the client rows.
HEALTH_PREFIX = "client_health-"


class Clock:
    """Monotonic seconds on the epoch scale (see the module docstring)."""

    def __init__(self) -> None:
        self._wall_anchor = time.time()
        self._perf_anchor = time.perf_counter()

    def now(self) -> float:
        return self._wall_anchor + (time.perf_counter() - self._perf_anchor)


@dataclass(slots=True)
class ClientRecord:
    """One request as the client saw it; ``None`` means the moment never came."""

    worker: str
    seq: int  # the worker's n-th request
    plan_index: int  # which planned request (loadtests.plan) it sent
    group: str
    is_warmup: bool
    send_time: float
    scheduled_time: float | None = None  # open loop: when the arrival process meant it to go
    first_byte_time: float | None = None  # response headers received
    first_token_time: float | None = None  # first chunk with text
    end_time: float | None = None  # the chunk with finish_reason (never the usage chunk)
    token_times: list[float] = field(default_factory=list)  # one per content chunk
    status_code: int = 0  # 0: no HTTP response at all
    error: str | None = None
    finish_reason: str | None = None
    request_id: str | None = None  # the server's id for it
    num_prompt_tokens: int | None = None  # per the server's usage
    num_output_tokens: int | None = None  # per the server's usage, else content chunks
    num_cached_tokens: int | None = None
    has_usage: bool = False
    planned_prompt_tokens: int = 0
    max_tokens: int = 0
    # NOTE: a request whose pooled connection the server closed before any answer is sent again, once, on a
    # fresh connection (loadtests.client.stream_client); the row is the second attempt's, and says so here.
    num_retries: int = 0
    retry_error: str | None = None  # what the first attempt met
    # The server's own account of the request, when its stream carries one (llama.cpp's ``timings``).
    server_prompt_s: float | None = None  # prompt processing
    server_decode_s: float | None = None  # generating the output tokens
    server_decode_tokens: int | None = None  # the tokens that time covers

    @property
    def is_ok(self) -> bool:
        return self.status_code == 200 and self.error is None

    # NOTE: the derived latencies, defined here alone; Locust's rows and the merged table both use them.
    @property
    def ttft_s(self) -> float | None:
        """Send -> first content token."""
        return self.first_token_time - self.send_time if self.first_token_time is not None else None

    @property
    def e2e_s(self) -> float | None:
        """Send -> the finish chunk, for a request that succeeded."""
        return self.end_time - self.send_time if self.end_time is not None and self.is_ok else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: (finish - first token) / (tokens - 1).

        NOTE: the finish chunk, not the last text chunk, closes the span: tokens that decode to no
        text (special tokens, bytes held back by the detokenizer) still took their time.
        """
        n = self.num_output_tokens or 0
        if not self.is_ok or self.first_token_time is None or self.end_time is None or n < 2:
            return None
        return (self.end_time - self.first_token_time) / (n - 1)

    @property
    def itl_s(self) -> list[float]:
        """Every gap between consecutive content chunks."""
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClientRecord:
        return cls(**data)


class LineSink(Protocol):
    """Where a worker's JSON lines go: a file in the run directory, or (a worker of a master) the master."""

    def write_line(self, line: str) -> None: ...

    def close(self) -> None: ...


class LineFile:
    """Appends lines to one file, each flushed at once.

    NOTE: a line per finished request, flushed at once, so a worker that dies loses only the
    requests it had in flight; the merge skips a torn last line.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write_line(self, line: str) -> None:
        if self._file is None:
            raise RuntimeError(f"{self.path} is closed")
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Journal:
    """A worker's client rows, one JSON line per request, into ``lines``."""

    def __init__(self, lines: LineSink) -> None:
        self._lines = lines
        self.num_records = 0

    @classmethod
    def in_run_dir(cls, run_dir: str | os.PathLike[str], worker: str) -> Journal:
        """The journal file ``client_requests-<worker>.jsonl`` of ``run_dir`` (appended to)."""
        return cls(LineFile(journal_path(run_dir, worker)))

    def write(self, record: ClientRecord) -> None:
        self._lines.write_line(record.to_json())
        self.num_records += 1

    def close(self) -> None:
        self._lines.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def journal_path(run_dir: str | os.PathLike[str], worker: str) -> Path:
    return Path(run_dir) / f"{JOURNAL_PREFIX}{worker}{JOURNAL_SUFFIX}"


def journal_paths(run_dir: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(run_dir).glob(f"{JOURNAL_PREFIX}*{JOURNAL_SUFFIX}"))


def read_journal(path: Path) -> list[ClientRecord]:
    """The records of one journal; a last line cut short (the worker died mid-write) is dropped."""
    return [ClientRecord.from_dict(line) for line in read_json_lines(path)]


class JsonLinesTail:
    """What workers appended to JSON-lines files since the last poll, whole lines only: a line still being
    written waits for the next poll."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}

    def poll(self, paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
        """The new objects of ``paths``, file by file. NOTE: a file counts as read once its objects were all
        taken: consume the whole iterator."""
        for path in paths:
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                if line.strip():
                    yield json.loads(line)
            self._offsets[path] = offset + end


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file a worker appends to; a torn last line (it died mid-write) is dropped."""
    objects = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            objects.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not a JSON record") from None
    return objects
