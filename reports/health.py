"""Whether a run can be judged at all: a verdict on a run whose requests failed would be a guess.

A point with no measured request, with every request failed, or with more than
``MAX_FAILED_SHARE`` of them failed for reasons that say the run is broken, and a run whose probes
stopped on an error, get no verdict; the report and ``diagnosis.json`` lead with what went wrong
instead (counts, status codes, the first error body).

Overload is evidence, not a broken run: a point whose failures are of the kinds a limit causes
(``reports.failures.OVERLOAD_KINDS``: dropped, timed out, refused as busy, out of context or KV
cache) is judged, and its failures feed the verdict, when a lighter load of the same run (an
earlier point, or the single-stream reference a ``--users N`` run takes) held without them. The
same failures with no lighter load to show that they came with the load are failures at every
load: no verdict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from probes.manifest import RunStatus
from reports.dataset import RunDataset
from reports.failures import FailureCounts, failure_counts
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
    # Every point with failures: its label -> its FailureCounts (as a dict) and how they were read.
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)
    overloaded: list[str] = field(default_factory=list)  # points judged with their overload failures as evidence
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


def point_failures(data: RunDataset, measures: PointMeasures) -> tuple[str, FailureCounts | None]:
    """How one point's failures read: ``"ok"`` (none past ``MAX_FAILED_SHARE``, or no client rows), ``"overload"``
    (past it, but of overload kinds) or ``"broken"``; and the counts by kind, of the requests that finished (the
    ones the end of the load cut off are neither).

    NOTE: a point where every request failed is overload too when they all failed of overload kinds
    (llama-server's unified KV pool runs out for every sequence at once); whether a lighter load held
    is run_health's call."""
    c = measures.client
    if c is None or c.num_requests == 0:
        return "ok", None
    rows = data.latencies
    counts = failure_counts(rows[~_is_cut_off(rows)])
    if counts.num_failed <= MAX_FAILED_SHARE * counts.num_requests:
        return "ok", counts
    return ("overload" if counts.num_broken <= MAX_FAILED_SHARE * counts.num_requests else "broken"), counts


def run_health(points: list[RunDataset], measures: list[PointMeasures],
               reference_failed_share: float | None = None) -> RunHealth:
    """The health of a run's points (in order of load). ``reference_failed_share``: the share of the run's
    single-stream reference requests that failed (None when it took none), the lighter load of a one-point run."""
    health = RunHealth()
    held: list[str] = []  # points, lightest first, whose failures stayed within MAX_FAILED_SHARE
    if reference_failed_share is not None and reference_failed_share <= MAX_FAILED_SHARE:
        held.append("the single-stream reference")
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
        verdict, counts = point_failures(data, m)
        if counts is not None and counts.num_failed:
            health.failures[m.label] = {**counts.to_dict(), "read_as": _read_as(verdict, counts)}
        if c.num_ok == 0 and num_failed == 0:
            if m.server is not None and m.server.num_steps > 0:
                health.notes.append(f"{m.label}: no measured request finished; its {cut_off} were still in flight "
                                    f"when the load stopped, so they count by their progress (the tokens the engine "
                                    f"streamed in the window)")
            else:
                health.problems.append(f"{m.label}: none of its {c.num_requests} requests finished before the load "
                                       f"stopped, and no engine steps say what they did")
        elif verdict == "ok":
            held.append(m.label)
        elif verdict == "broken" and c.num_ok == 0:
            health.problems.append(f"{m.label}: every one of its {c.num_requests} requests failed")
        elif verdict == "broken":
            health.problems.append(f"{m.label}: {c.num_failed} of its {c.num_requests} requests failed "
                                   f"(over {MAX_FAILED_SHARE:.0%}, not from overload)")
        elif held:
            health.overloaded.append(m.label)
            health.failures[m.label]["read_as"] += f" ({held[-1]} held without them)"
        else:
            health.problems.append(f"{m.label}: {counts.describe() if counts else ''}, and no lighter load of this "
                                   f"run held without them: failures at every load measured, not a limit the load "
                                   f"found")
        if health.first_error is None and num_failed:
            health.first_error = _first_error(data)
    return health


def _read_as(verdict: str, counts: FailureCounts) -> str:
    if verdict == "overload":
        return "overload: evidence of the server's limit at this load"
    if verdict == "broken":
        return "a broken run: no verdict"
    if counts.num_overload and not counts.num_broken:
        return f"within {MAX_FAILED_SHARE:.0%}: judged; read as evidence of overload"
    return f"within {MAX_FAILED_SHARE:.0%}: judged"


def _first_error(data: RunDataset) -> str | None:
    rows = data.latencies
    failed = rows[~rows["is_ok"].astype(bool) & ~_is_cut_off(rows)].sort_values("start_time")
    errors = failed["error"].dropna()
    return str(errors.iloc[0]) if len(errors) else None


def _is_cut_off(rows: pd.DataFrame) -> pd.Series:
    """Which client rows the end of the load cut off while in flight (see :data:`CUT_OFF_PREFIX`)."""
    return ~rows["is_ok"].astype(bool) & rows["error"].fillna("").astype(str).str.startswith(CUT_OFF_PREFIX)


def num_cut_off(data: RunDataset) -> int:
    """The measured requests the end of the load cut off while in flight."""
    rows = data.latencies
    return int(_is_cut_off(rows).sum()) if len(rows) else 0
