"""Why requests failed, in kinds a verdict can read: overload (a limit the load found) or a broken run.

A server that drops, refuses or times out requests, or runs out of context or KV cache, only above
some load has shown where its limit is, and by how it failed, which limit; those kinds are
``OVERLOAD_KINDS``. Anything else (a 4xx for the request itself, a 500 that names no resource, a
server that does not accept connections) says the run is broken, whatever the load.

Each kind is read off a client row's ``status_code`` and ``error`` text (the server's error body or
in-stream error message, or the exception the client met): the patterns below are the words the
servers servescope meets use (llama.cpp's ``llama-server``: ``exceed_context_size_error``, "Context
size has been exceeded." inside a 200 stream; vLLM: "maximum context length"; HTTP 429 and 503 from
any server that sheds load).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

FailureKind = Literal["dropped", "timed_out", "refused_busy", "context_full", "unreachable", "server_error",
                      "client_error"]
OVERLOAD_KINDS: frozenset[str] = frozenset({"dropped", "timed_out", "refused_busy", "context_full"})
# What the server (or the connection) did, in words, for the console and the report.
KIND_WORDS: dict[str, str] = {
    "dropped": "dropped (the connection closed, or the stream stopped, with no answer)",
    "timed_out": "timed out",
    "refused_busy": "refused as busy (HTTP 429/503)",
    "context_full": "out of context or KV cache",
    "unreachable": "could not connect",
    "server_error": "server error",
    "client_error": "request refused (HTTP 4xx)",
}
# NOTE: lower-case substrings; the first kind whose pattern matches wins, context before the status code
# (llama-server answers a full KV pool with a 500 and an oversized request with a 400).
CONTEXT_PATTERNS = ("context size has been exceeded", "exceed_context_size", "exceeds the available context",
                    "larger than the max context", "maximum context length", "kv cache", "out of memory")
TIMEOUT_PATTERNS = ("timed out", "timeout")
UNREACHABLE_PATTERNS = ("connection refused", "failed to establish a new connection", "name or service not known",
                        "nodename nor servname")
DROPPED_PATTERNS = ("remotedisconnected", "remote end closed", "connection aborted", "connection reset",
                    "server disconnected", "connection broken", "incompleteread", "chunkedencodingerror",
                    "the stream ended without a finish_reason", "broken pipe", "eof occurred")


def failure_kind(status_code: int, error: str | None) -> FailureKind:
    """The kind of one failed request from its HTTP status (0: no answer) and its error text."""
    text = (error or "").lower()
    if any(p in text for p in CONTEXT_PATTERNS):
        return "context_full"
    if status_code in (429, 503):
        return "refused_busy"
    if status_code == 0 or status_code == 200:
        if any(p in text for p in UNREACHABLE_PATTERNS):
            return "unreachable"
        if any(p in text for p in TIMEOUT_PATTERNS):
            return "timed_out"
        if any(p in text for p in DROPPED_PATTERNS):
            return "dropped"
        return "server_error"  # an error event inside a 200 stream that names no resource
    return "client_error" if 400 <= status_code < 500 else "server_error"


@dataclass(slots=True)
class FailureCounts:
    """The failed requests of one load point by kind, and how many requests it sent."""

    num_requests: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    num_retried: int = 0  # requests retried once because a pooled connection closed before any answer

    @property
    def num_failed(self) -> int:
        return sum(self.by_kind.values())

    @property
    def num_overload(self) -> int:
        return sum(n for kind, n in self.by_kind.items() if kind in OVERLOAD_KINDS)

    @property
    def num_broken(self) -> int:
        return self.num_failed - self.num_overload

    def share(self, *kinds: str) -> float:
        """The share of the point's requests that failed with one of ``kinds``."""
        return sum(self.by_kind.get(k, 0) for k in kinds) / self.num_requests if self.num_requests else 0.0

    def describe(self) -> str:
        """E.g. "12 of 80 requests failed: 9 dropped (...), 3 out of context or KV cache"."""
        if not self.num_failed:
            return f"none of {self.num_requests} requests failed"
        parts = ", ".join(f"{n} {KIND_WORDS.get(kind, kind)}" for kind, n in
                          sorted(self.by_kind.items(), key=lambda item: -item[1]))
        return f"{self.num_failed} of {self.num_requests} requests failed: {parts}"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "num_failed": self.num_failed, "num_overload": self.num_overload}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FailureCounts:
        return cls(num_requests=int(data["num_requests"]), by_kind={str(k): int(v) for k, v in data["by_kind"].items()},
                   num_retried=int(data.get("num_retried", 0)))


def failure_counts(rows: pd.DataFrame) -> FailureCounts:
    """The failures of a point's client rows (``client_requests.parquet``'s columns) by kind."""
    counts = FailureCounts(num_requests=len(rows))
    if "num_retries" in rows:
        counts.num_retried = int((rows["num_retries"].fillna(0) > 0).sum())
    failed = rows[~rows["is_ok"].astype(bool)]
    for status, error in zip(failed["status_code"].fillna(0).astype(int), failed["error"], strict=True):
        kind = failure_kind(int(status), error if isinstance(error, str) else None)
        counts.by_kind[kind] = counts.by_kind.get(kind, 0) + 1
    return counts
