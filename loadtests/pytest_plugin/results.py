"""What a test gets back from one load point: :class:`LoadRun`, read from the run directory ``servescope load`` wrote.

Every figure is the one ``summary.json`` and ``diagnosis.json`` hold (the console table, the report and
the verdict read the same files), plus the raw per-request values from the client rows, so
``assert run.ttft.p50 < 0.5`` and ``run.ttft.values`` agree with ``servescope report`` on the same run.

NOTE: this module is imported when pytest loads the plugin; it imports nothing heavy at the top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reports.summary import PointMeasures
    from reports.verdict.diagnosis import Diagnosis
    from reports.verdict.evidence import Evidence

# The per-request latencies a run has, by the name tests use; each is ``<name>_s`` in summary.json.
LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATISTICS = ("mean", "p50", "p90", "p95", "p99", "max")


@dataclass(frozen=True, slots=True)
class Distribution:
    """One latency over the measured (warm-up excluded) successful requests, in seconds.

    The statistics are summary.json's; ``values`` are the per-request values they were computed from
    (per gap for ITL). With no values every statistic is NaN, so any bound on it fails. NOTE: a successful
    request can lack a TTFT: a stream whose text all came in its last chunk shows no first token.
    """

    name: str
    values: tuple[float, ...]
    mean: float = math.nan
    p50: float = math.nan
    p90: float = math.nan
    p95: float = math.nan
    p99: float = math.nan
    max: float = math.nan

    @property
    def count(self) -> int:
        return len(self.values)

    @classmethod
    def from_summary(cls, name: str, stats: dict[str, float] | None, values: list[float]) -> Distribution:
        if not stats:
            return cls(name, tuple(values))
        return cls(name, tuple(values), **{s: float(stats[s]) for s in STATISTICS})

    def describe(self) -> str:
        """``TTFT p50 274 ms, p90 911 ms, p99 1.20 s, max 1.31 s (10 requests)``."""
        if not self.values:
            return f"{self.name.upper()}: none measured"
        unit = "gaps" if self.name == "itl" else "requests"
        stats = ", ".join(f"{s} {format_seconds(getattr(self, s))}" for s in ("p50", "p90", "p99", "max"))
        return f"{self.name.upper()} {stats} ({self.count} {unit})"

    def __repr__(self) -> str:
        # NOTE: pytest prints this in an assertion's "where" line, so a failed bound shows the distribution.
        return f"<{self.describe()}>"


@dataclass(frozen=True, slots=True)
class Goodput:
    """The measured requests that succeeded within every bound of the run's SLO (``llm_load(slo=...)``)."""

    slo_s: dict[str, float]
    num_good: int
    fraction: float | None
    good_requests_per_s: float | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """diagnosis.json in short: which lever holds the server back (``None`` when the run cannot be judged)."""

    bottleneck: str | None
    summary: str
    lever: str
    confidence: float
    evidence: tuple[Evidence, ...]  # the deciding rules first, then every other rule evaluated
    deciding: tuple[str, ...]

    @property
    def deciding_evidence(self) -> tuple[Evidence, ...]:
        return tuple(e for e in self.evidence if e.name in self.deciding)


@dataclass(frozen=True, slots=True, repr=False)
class LoadRun:
    """One load point as a test sees it: latencies, throughput, goodput, failures and the verdict."""

    run_dir: Path
    label: str  # users-8, rate-2, ...
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    num_requests: int  # measured (warm-up excluded), failed ones included
    num_ok: int
    num_failed: int
    errors: dict[str, int]  # the commonest failure messages
    output_tokens_per_s: float
    requests_per_s: float
    goodput: Goodput | None
    verdict: Verdict
    warnings: tuple[str, ...]  # what makes the client-side figures suspect (an overloaded load generator...)
    measures: PointMeasures = field(repr=False)  # the whole summary.json point
    diagnosis: Diagnosis = field(repr=False)  # the whole diagnosis.json

    def __repr__(self) -> str:
        # NOTE: one line for pytest's assertion messages; describe() has the rest.
        return (f"<LoadRun {self.label}: {self.num_ok} ok, {self.num_failed} failed, "
                f"{self.output_tokens_per_s:.1f} output tok/s; {self.run_dir}>")

    @property
    def report_path(self) -> Path:
        from probes.run_dir import REPORT_NAME

        return self.run_dir / REPORT_NAME

    def describe(self) -> str:
        """A few lines for a failing test's report: where the run is, what it measured, the verdict."""
        lines = [f"{self.label}: {self.num_ok} ok, {self.num_failed} failed, "
                 f"{self.output_tokens_per_s:.1f} output tok/s, {self.requests_per_s:.2f} req/s"]
        lines += [f"  {getattr(self, name).describe()}" for name in LATENCIES]
        if self.goodput is not None and self.goodput.fraction is not None:
            lines.append(f"  goodput {self.goodput.fraction:.0%} within {self.goodput.slo_s}")
        if self.errors:
            lines.append(f"  failures: {self.errors}")
        lines.append(f"  verdict: {self.verdict.bottleneck or 'none given'}: {self.verdict.summary}")
        lines += [f"  evidence: {e.summary} ({e.name})" for e in self.verdict.deciding_evidence]
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  run directory: {self.run_dir}", f"  report: {self.report_path}"]
        return "\n".join(lines)

    @classmethod
    def from_run_dir(cls, path: str | Path) -> LoadRun:
        """Read one load point's run directory (after ``summary.json`` and ``diagnosis.json`` are written)."""
        from probes.run_dir import DIAGNOSIS_NAME, SUMMARY_NAME, RunDirectory
        from reports.dataset import RunDataset
        from reports.summary import RunSummary
        from reports.verdict.diagnosis import Diagnosis

        run_dir = Path(path)
        directory = RunDirectory(run_dir)
        summary = directory.load(SUMMARY_NAME, RunSummary)
        diagnosis = directory.load(DIAGNOSIS_NAME, Diagnosis)
        if summary is None or diagnosis is None:
            raise FileNotFoundError(f"{run_dir} has no {SUMMARY_NAME} and {DIAGNOSIS_NAME}: the load point did "
                                    f"not finish (see locust.log there)")
        if len(summary.points) != 1:
            raise ValueError(f"{run_dir} holds {len(summary.points)} load points; a LoadRun is one")
        point = summary.points[0]
        client = point.client
        rows = RunDataset.load(run_dir).latencies
        ok = rows[rows["is_ok"].astype(bool)]
        values = {name: _finite(ok[f"{name}_s"]) for name in ("ttft", "tpot", "e2e")}
        values["itl"] = [float(g) for gaps in ok["itl_s"] if gaps is not None for g in gaps]
        stats = {name: getattr(client, f"{name}_s") if client is not None else None for name in LATENCIES}
        good = client.goodput if client is not None else None
        return cls(
            run_dir=run_dir, label=point.label,
            **{name: Distribution.from_summary(name, stats[name], values[name]) for name in LATENCIES},
            num_requests=client.num_requests if client is not None else 0,
            num_ok=client.num_ok if client is not None else 0,
            num_failed=client.num_failed if client is not None else 0,
            errors=dict(client.errors) if client is not None else {},
            output_tokens_per_s=_number(client.output_throughput if client is not None else None),
            requests_per_s=_number(client.request_throughput if client is not None else None),
            goodput=Goodput(dict(good["slo_s"]), int(good["num_good"]), good["fraction"],
                            good["good_requests_per_s"]) if good else None,
            verdict=Verdict(bottleneck=diagnosis.bottleneck if diagnosis.has_verdict else None,
                            summary=diagnosis.summary, lever=diagnosis.lever, confidence=diagnosis.confidence,
                            evidence=tuple(diagnosis.evidence), deciding=tuple(diagnosis.deciding)),
            warnings=tuple(w.message for w in point.warnings), measures=point, diagnosis=diagnosis,
        )


def format_seconds(value: float) -> str:
    """``1.20 s``, ``506 ms``, ``0.5 us``: three figures at most, in the unit that reads best."""
    if not math.isfinite(value):
        return "n/a"
    if value >= 0.9995:
        return f"{value:.3g} s"
    return f"{value * 1e3:.3g} ms" if value >= 0.0009995 else f"{value * 1e6:.3g} us"


def _finite(column: Any) -> list[float]:
    return [float(v) for v in column.dropna()]


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)
