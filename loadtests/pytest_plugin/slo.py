"""SLO assertions on a :class:`LoadRun` that say what was measured, not just that a bound failed.

``check_slo(run, ttft_p99=0.5, max_failed=0)`` and the marker ``@pytest.mark.llm_slo(ttft_p99=0.5)``
take the same bounds:

- ``<latency>_<statistic>=S``: at most S seconds, for latency ttft, tpot, itl or e2e and statistic
  mean, p50, p90, p95, p99 or max (``ttft_p99=0.5``);
- ``min_output_tokens_per_s=X``, ``min_requests_per_s=X``: at least X;
- ``min_goodput=F``: at least share F of the measured requests within the run's own SLO
  (``llm_load(slo={"ttft": 0.5})``);
- ``max_failed=N``: at most N failed requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from loadtests.pytest_plugin.results import LATENCIES, STATISTICS, LoadRun, format_seconds

RATES = ("output_tokens_per_s", "requests_per_s")


class SLOViolation(AssertionError):
    """A load point missed one or more bounds; the message lists every bound with what was measured."""


@dataclass(frozen=True, slots=True)
class Bound:
    """One bound of an SLO, by the keyword that set it."""

    keyword: str
    limit: float

    def measured(self, run: LoadRun) -> float:
        name = self.keyword
        if name == "max_failed":
            return float(run.num_failed)
        if name == "min_goodput":
            if run.goodput is None or run.goodput.fraction is None:
                raise ValueError("min_goodput needs the run's SLO: llm_load(..., slo={'ttft': 0.5})")
            return float(run.goodput.fraction)
        if name.startswith("min_"):
            return float(getattr(run, name.removeprefix("min_")))
        latency, _, statistic = name.partition("_")
        return float(getattr(getattr(run, latency), statistic))

    @property
    def is_upper(self) -> bool:
        return not self.keyword.startswith("min_")

    def holds(self, value: float) -> bool:
        # NOTE: NaN (nothing measured) holds no bound.
        return value <= self.limit if self.is_upper else value >= self.limit

    def line(self, run: LoadRun) -> str:
        """``ttft p99 = 1.20 s > 0.5 s: FAILED; TTFT p50 ..., p99 ... (10 requests)``."""
        value = self.measured(run)
        ok = self.holds(value) and not math.isnan(value)
        sign = ("<=" if ok else ">") if self.is_upper else (">=" if ok else "<")
        latency = self.keyword.partition("_")[0]
        if latency in LATENCIES:
            text = f"{self.keyword.replace('_', ' ')} = {format_seconds(value)} {sign} {format_seconds(self.limit)}"
            detail = getattr(run, latency).describe()
        else:
            text = f"{self.keyword} = {value:g} {sign} {self.limit:g}"
            detail = _detail(self.keyword, run)
        return f"{'ok    ' if ok else 'FAILED'} {text}; {detail}"


def parse_bounds(bounds: dict[str, Any]) -> list[Bound]:
    """The bounds of ``check_slo``'s keywords; an unknown keyword is an error that lists the known ones."""
    known = {f"{latency}_{s}" for latency in LATENCIES for s in STATISTICS}
    known |= {f"min_{r}" for r in RATES} | {"min_goodput", "max_failed"}
    unknown = sorted(set(bounds) - known)
    if unknown:
        raise ValueError(f"unknown SLO bound(s) {unknown}; known: <latency>_<statistic> for latency in "
                         f"{', '.join(LATENCIES)} and statistic in {', '.join(STATISTICS)} (ttft_p99=0.5), "
                         f"{', '.join(f'min_{r}' for r in RATES)}, min_goodput, max_failed")
    if not bounds:
        raise ValueError("an SLO needs at least one bound, e.g. ttft_p99=0.5")
    out = []
    for keyword, limit in bounds.items():
        if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit) or limit < 0:
            raise ValueError(f"SLO bound {keyword}={limit!r} must be a finite number >= 0")
        out.append(Bound(keyword, float(limit)))
    return out


def check_slo(run: LoadRun, **bounds: float) -> None:
    """Raise :class:`SLOViolation` when ``run`` misses any bound (see the module docstring for the keywords)."""
    __tracebackhide__ = True  # NOTE: pytest shows the test's line, not this one
    parsed = parse_bounds(bounds)
    failed = [b for b in parsed if not b.holds(b.measured(run))]
    if failed:
        raise SLOViolation(slo_message(run, parsed, len(failed)))


def slo_message(run: LoadRun, bounds: list[Bound], num_failed: int) -> str:
    lines = [f"SLO not met at {run.label}: {num_failed} of {len(bounds)} bound(s) failed"]
    lines += [f"  {b.line(run)}" for b in bounds]
    lines += [f"  verdict: {run.verdict.bottleneck or 'none given'}: {run.verdict.summary}",
              f"  run directory: {run.run_dir}", f"  report: {run.report_path}"]
    return "\n".join(lines)


def _detail(keyword: str, run: LoadRun) -> str:
    if keyword == "max_failed":
        return f"{run.num_failed} of {run.num_requests} measured requests failed" + (
            f": {run.errors}" if run.errors else "")
    if keyword == "min_goodput" and run.goodput is not None:
        return f"{run.goodput.num_good} of {run.num_requests} requests within {run.goodput.slo_s}"
    return f"{run.num_ok} ok requests, {run.output_tokens_per_s:.1f} output tok/s, {run.requests_per_s:.2f} req/s"
