"""A short single-stream reference taken in the same run as a load point: ``single_stream.json``.

Two readings of the point need what one request alone gets from the same server at the same moment:
whether the load slowed each stream (TPOT under load against TPOT alone: a saturated device), and
whether the load made requests fail (failures the reference did not meet came with the load). A
capacity search has its 1-user point for both; a ``--users N`` run takes this reference after its
load, with the load's own first planned requests, one at a time, each on a fresh connection.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

SINGLE_STREAM_NAME = "single_stream.json"


@dataclass(slots=True)
class SingleStream:
    """The reference requests' outcomes and timings (seconds); ``errors`` holds each failed one's status and text."""

    num_requests: int
    tpot_s: list[float] = field(default_factory=list)  # one per successful request with 2+ output tokens
    ttft_s: list[float] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)  # {"status_code": int, "error": str}
    measured_at: float = 0.0
    method: str = ""

    @property
    def num_failed(self) -> int:
        return len(self.errors)

    @property
    def failed_share(self) -> float:
        return self.num_failed / self.num_requests if self.num_requests else 1.0

    @property
    def tpot_p50_s(self) -> float | None:
        return statistics.median(self.tpot_s) if self.tpot_s else None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "tpot_p50_s": self.tpot_p50_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SingleStream:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})
