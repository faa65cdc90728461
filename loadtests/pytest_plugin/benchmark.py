"""A load point recorded into pytest-benchmark, so its save, compare and compare-fail work on LLM metrics.

pytest-benchmark keeps one list of timed rounds per benchmark and compares two saved runs by the
statistics of those rounds. Per-request times are such rounds: each measured (warm-up excluded)
successful request's TTFT is one round of a benchmark ``test_x[ttft]``, its E2E one round of
``test_x[e2e]`` (and TPOT, when asked for), the values the client rows hold, not re-timed. So
``--benchmark-autosave`` stores them, and ``--benchmark-compare`` / ``--benchmark-compare-fail=median:10%``
compare and fail on them with pytest-benchmark's own statistics and checks.

Tokens per second is not a time per round (a round's reciprocal does not average to it), so it is kept
in each benchmark's ``extra_info`` and compared by this plugin's own ``--llm-compare-fail
output_tokens_per_s:10%`` against the run ``--benchmark-compare`` loaded.

NOTE: pytest-benchmark has no public call that adds rounds measured elsewhere. Its private surface used
here is :func:`record_rounds` and :func:`check_unused` (``Metadata``, the fixture's ``_add_stats`` and ``_mode``) and
:func:`compared_extra_info` (the session's ``compared_mapping``); the plugin's tests exercise both.
"""

from __future__ import annotations

import argparse
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.pytest_plugin.results import LATENCIES, LoadRun

# Latencies that are one value per request, so one benchmark round each.
ROUND_METRICS = ("ttft", "tpot", "e2e")
DEFAULT_ROUND_METRICS = ("ttft", "e2e")
# Figures --llm-compare-fail checks; higher is better for each, so a drop past the threshold fails.
RATE_FIELDS = {"output_tokens_per_s": "output tok/s", "requests_per_s": "requests/s",
               "goodput_fraction": "goodput share"}
_CHECK = re.compile(r"^(?P<field>[a-z_]+):(?P<percent>[0-9]*\.?[0-9]+)%$")


@dataclass(frozen=True, slots=True)
class RateCheck:
    """``--llm-compare-fail FIELD:X%``: fail when FIELD fell more than X% below the compared run's."""

    field: str
    percent: float

    def fails(self, now: float, base: float) -> str | None:
        """Why ``now`` against ``base`` is a regression, or None."""
        if not (math.isfinite(base) and base > 0):
            return None
        drop = (1.0 - now / base) * 100.0 if math.isfinite(now) else math.inf
        if drop <= self.percent:
            return None
        return (f"{RATE_FIELDS[self.field]} fell {drop:.1f}% ({base:.4g} -> {now:.4g}), more than "
                f"--llm-compare-fail {self.field}:{self.percent:g}% allows")


def parse_rate_check(text: str) -> RateCheck:
    """``"output_tokens_per_s:10%"`` -> RateCheck (an argparse ``type``)."""
    match = _CHECK.match(text.strip())
    if match is None or match["field"] not in RATE_FIELDS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD:X% with FIELD one of {', '.join(RATE_FIELDS)} "
                                         f"(e.g. output_tokens_per_s:10%)")
    return RateCheck(match["field"], float(match["percent"]))


@dataclass(slots=True)
class MetricBenchmark:
    """What pytest-benchmark's ``Metadata`` reads of a fixture: one metric's identity under the test's."""

    name: str
    fullname: str
    group: str | None
    param: str | None
    params: dict[str, Any] | None
    extra_info: dict[str, Any]
    cprofile_stats: Any = None
    has_error: bool = field(default=False)


def with_metric(name: str, metric: str) -> str:
    """``test_x`` -> ``test_x[ttft]``; ``test_x[4]`` -> ``test_x[4-ttft]`` (a parameter id, as pytest writes them)."""
    return f"{name[:-1]}-{metric}]" if name.endswith("]") else f"{name}[{metric}]"


def check_metrics(metrics: tuple[str, ...]) -> None:
    """ValueError for a metric that is not a per-request time (before any load is offered)."""
    unknown = [m for m in metrics if m not in ROUND_METRICS]
    if unknown or not metrics:
        raise ValueError(f"llm_benchmark records per-request times: metrics from {', '.join(ROUND_METRICS)}, "
                         f"got {metrics!r}")


def extra_info(run: LoadRun, target: str) -> dict[str, Any]:
    """The run's LLM figures as pytest-benchmark stores them beside the rounds (JSON-safe)."""
    def number(value: float | None) -> float | None:
        return value if value is not None and math.isfinite(value) else None

    info: dict[str, Any] = {
        "target": target, "point": run.label, "load": run.measures.load,
        "output_tokens_per_s": number(run.output_tokens_per_s), "requests_per_s": number(run.requests_per_s),
        "goodput_fraction": run.goodput.fraction if run.goodput is not None else None,
        "num_requests": run.num_requests, "num_ok": run.num_ok, "num_failed": run.num_failed,
        "bottleneck": run.verdict.bottleneck, "verdict": run.verdict.summary, "run_dir": str(run.run_dir),
    }
    for name in LATENCIES:
        latency = getattr(run, name)
        info.update({f"{name}_{s}_s": number(getattr(latency, s)) for s in ("p50", "p90", "p99")})
    return info


def check_unused(benchmark: Any) -> None:
    """ValueError when the test already used pytest-benchmark's fixture: it holds one measurement per test."""
    if benchmark._mode:
        raise ValueError(f"this test already used pytest-benchmark's fixture ({benchmark._mode}); a test records "
                         f"one load point: use a test (or a parametrized one) per point")


def record_rounds(benchmark: Any, run: LoadRun, metrics: tuple[str, ...], target: str) -> list[Any]:
    """Add one pytest-benchmark entry per metric of ``metrics`` to the session, rounds = per-request values.

    Returns the entries (``pytest_benchmark.stats.Metadata``); none when pytest-benchmark is disabled.
    """
    from pytest_benchmark.stats import Metadata

    # NOTE: marks the test's own fixture as used, as benchmark()/pedantic() do: no "not used" warning,
    # and a second use in the same test fails as pytest-benchmark's own does.
    benchmark._mode = "llm_benchmark(...)"
    if benchmark.disabled:
        return []
    if run.num_ok == 0:
        raise ValueError(f"{run.label}: no successful request was measured ({run.num_failed} failed), nothing to "
                         f"record; {run.verdict.summary}")
    entries = []
    info = extra_info(run, target)
    options = {"rounds": "one per measured successful request, warm-up excluded",
               "timer": "servescope client rows (client_requests.parquet)"}
    for metric in metrics:
        values = list(getattr(run, metric).values)
        if not values:
            # NOTE: a request can succeed without a TTFT (a stream whose text all came in its last chunk);
            # pytest-benchmark cannot store a benchmark of no rounds, so this metric sits this run out.
            warnings.warn(f"{benchmark.fullname}: no {metric} measured at {run.label} ({run.num_ok} ok, "
                          f"{run.num_failed} failed): {with_metric(benchmark.name, metric)} is not recorded",
                          stacklevel=3)  # the test's call of llm_benchmark
            continue
        view = MetricBenchmark(
            name=with_metric(benchmark.name, metric), fullname=with_metric(benchmark.fullname, metric),
            group=f"{benchmark.group}: {metric}" if benchmark.group else f"{metric.upper()} per request",
            param=f"{benchmark.param}-{metric}" if benchmark.param else metric,
            params={**(benchmark.params or {}), "metric": metric}, extra_info={**info, "metric": metric})
        entry = Metadata(view, iterations=1, options=options)
        for value in values:
            entry.update(value)
        benchmark._add_stats(entry)
        entries.append(entry)
    if not entries:
        raise ValueError(f"{run.label}: none of {', '.join(metrics)} was measured in {run.num_ok} successful "
                         f"requests: nothing to record")
    benchmark.extra_info.update(info)
    return entries


def compared_extra_info(config: Any, fullname: str) -> tuple[Path, dict[str, Any]] | None:
    """The compared run's ``extra_info`` for benchmark ``fullname`` and the file it came from, from the run
    ``--benchmark-compare`` loaded; None without a compared run or when it lacks this benchmark."""
    session = getattr(config, "_benchmarksession", None)
    mapping = getattr(session, "compared_mapping", None) or {}
    for path, benchmarks in mapping.items():
        if fullname in benchmarks:
            return Path(path), dict(benchmarks[fullname].get("extra_info") or {})
    return None


def check_rates(config: Any, checks: list[RateCheck], test: str, entry: Any) -> str | None:
    """Every ``--llm-compare-fail`` regression of a recorded entry's ``extra_info`` against the compared run's,
    as one message naming ``test``; None if none."""
    compared = compared_extra_info(config, entry.fullname)
    info = entry.extra_info
    if not checks or compared is None:
        return None
    path, base = compared
    failures = []
    for check in checks:
        now, then = info.get(check.field), base.get(check.field)
        if then is None:
            continue
        failure = check.fails(math.nan if now is None else float(now), float(then))
        if failure is not None:
            failures.append(failure)
    if not failures:
        return None
    return f"{test} against {path}:\n  " + "\n  ".join(failures)
