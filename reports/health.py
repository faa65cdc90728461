"""Whether a run can be judged at all: a verdict on a run whose requests failed would be a guess.

A point with no measured request, with every request failed, or with more than
``MAX_FAILED_SHARE`` of them failed, and a run whose probes stopped on an error, get no verdict;
the report and ``diagnosis.json`` lead with what went wrong instead (counts, status codes, the
first error body).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from probes.manifest import RunStatus
from reports.dataset import RunDataset
from reports.summary import PointMeasures

# Above this share of failed requests at any point, the run gets no verdict.
MAX_FAILED_SHARE = 0.2
# NOTE: how the client marks a request still in flight when the load stopped (loadtests.load_context): it was cut
# off by the end of the point, not failed by the server; its tokens count by their progress (engine token times).
CUT_OFF_PREFIX = "cancelled:"


@dataclass(slots=True)
class RunHealth:
    """What stops a run from being judged (``problems``; empty when it can be), with the failures' details."""

    problems: list[str] = field(default_factory=list)
    num_requests: int = 0
    num_failed: int = 0
    status_codes: dict[str, int] = field(default_factory=dict)  # of the failed requests (0: no HTTP answer)
    first_error: str | None = None
    num_cut_off: int = 0  # measured requests still in flight when the load stopped (not failures)
    notes: list[str] = field(default_factory=list)  # what the verdict rests on instead of finished requests

    @property
    def can_judge(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "can_judge": self.can_judge}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunHealth:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    def describe(self) -> str:
        """One paragraph: why there is no verdict, and the failures' counts and first error."""
        codes = ", ".join(f"{'no HTTP answer' if code == '0' else 'HTTP ' + code}: {n}"
                          for code, n in sorted(self.status_codes.items()))
        text = "; ".join(self.problems)
        if self.num_failed:
            text += f". {self.num_failed} of {self.num_requests} requests failed ({codes})"
        if self.first_error:
            text += f". First error: {self.first_error}"
        return text


def run_health(points: list[RunDataset], measures: list[PointMeasures]) -> RunHealth:
    health = RunHealth()
    for data, m in zip(points, measures, strict=True):
        manifest = data.manifest
        if manifest is not None and manifest.status is RunStatus.FAILED:
            health.problems.append(f"{m.label}: the run stopped on an error ({manifest.error})")
        c = m.client
        if c is None or c.num_requests == 0:
            if m.server is None or m.server.num_steps == 0:
                health.problems.append(f"{m.label}: no request was measured")
            continue
        cut_off = num_cut_off(data)
        num_failed = c.num_failed - cut_off
        health.num_requests += c.num_requests
        health.num_failed += num_failed
        health.num_cut_off += cut_off
        for code, n in c.status_codes.items():
            health.status_codes[code] = health.status_codes.get(code, 0) + n
        has_steps = m.server is not None and m.server.num_steps > 0
        if c.num_ok == 0 and num_failed == 0 and has_steps:
            health.notes.append(f"{m.label}: no measured request finished; its {cut_off} were still in flight when "
                                f"the load stopped, so they count by their progress (the tokens the engine streamed "
                                f"in the window)")
        elif c.num_ok == 0:
            health.problems.append(f"{m.label}: every one of its {c.num_requests} requests failed")
        elif num_failed > MAX_FAILED_SHARE * (c.num_requests - cut_off):
            health.problems.append(f"{m.label}: {num_failed} of its {c.num_requests - cut_off} finished requests "
                                   f"failed (over {MAX_FAILED_SHARE:.0%})")
        if health.first_error is None and num_failed:
            health.first_error = _first_error(data)
    return health


def _first_error(data: RunDataset) -> str | None:
    rows = data.latencies
    failed = rows[~rows["is_ok"].astype(bool)].sort_values("start_time")
    failed = failed[~failed["error"].fillna("").astype(str).str.startswith(CUT_OFF_PREFIX)]
    errors = failed["error"].dropna()
    return str(errors.iloc[0]) if len(errors) else None


def num_cut_off(data: RunDataset) -> int:
    """The measured requests the end of the load cut off while in flight (see :data:`CUT_OFF_PREFIX`)."""
    rows = data.latencies
    if not len(rows):
        return 0
    errors = rows.loc[~rows["is_ok"].astype(bool), "error"].dropna().astype(str)
    return int(errors.str.startswith(CUT_OFF_PREFIX).sum())
