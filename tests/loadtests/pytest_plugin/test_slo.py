"""SLO bounds on a LoadRun: which keywords exist, what holds, and what a violation says."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadtests.pytest_plugin.results import Distribution, Goodput, LoadRun, Verdict
from loadtests.pytest_plugin.slo import SLOViolation, check_slo, parse_bounds


def distribution(name: str, values: list[float]) -> Distribution:
    if not values:
        return Distribution(name, ())
    ordered = sorted(values)
    # NOTE: the statistics are given, as summary.json would give them; these tests check the bounds, not them.
    return Distribution(name, tuple(values), mean=sum(values) / len(values), p50=ordered[len(values) // 2],
                        p90=ordered[-2], p95=ordered[-1], p99=ordered[-1], max=ordered[-1])


def a_run(ttft: list[float], goodput: Goodput | None = None, num_failed: int = 0) -> LoadRun:
    return LoadRun(
        run_dir=Path("/runs/users-4"), label="users-4", ttft=distribution("ttft", ttft),
        tpot=distribution("tpot", [0.02, 0.03, 0.04]), itl=distribution("itl", [0.02] * 6),
        e2e=distribution("e2e", [1.0, 1.5, 2.0]), num_requests=3 + num_failed, num_ok=3, num_failed=num_failed,
        errors={"HTTP 503": num_failed} if num_failed else {}, output_tokens_per_s=40.0, requests_per_s=1.5,
        goodput=goodput, verdict=Verdict("batching", "requests queue behind max_num_seqs", "--max-num-seqs 16",
                                         0.8, (), ()),
        warnings=(), measures=None, diagnosis=None)  # type: ignore[arg-type]


def test_every_bound_is_listed_with_the_distribution_it_read() -> None:
    run = a_run([0.2, 0.4, 1.2])
    with pytest.raises(SLOViolation) as raised:
        check_slo(run, ttft_p99=0.5, e2e_p50=3.0, max_failed=0)
    lines = str(raised.value).splitlines()
    assert lines[0] == "SLO not met at users-4: 1 of 3 bound(s) failed"
    assert lines[1] == ("  FAILED ttft p99 = 1.2 s > 500 ms; TTFT p50 400 ms, p90 400 ms, p99 1.2 s, max 1.2 s "
                        "(3 requests)")
    assert lines[2].startswith("  ok     e2e p50 = 1.5 s <= 3 s; E2E p50 1.5 s")
    assert lines[3] == "  ok     max_failed = 0 <= 0; 0 of 3 measured requests failed"
    assert "  run directory: /runs/users-4" in lines


def test_bounds_that_hold_pass_and_rates_are_lower_bounds() -> None:
    run = a_run([0.2, 0.4, 0.45], goodput=Goodput({"ttft": 0.5}, 3, 1.0, 1.5))
    check_slo(run, ttft_p99=0.5, min_output_tokens_per_s=40.0, min_goodput=1.0, max_failed=0)
    with pytest.raises(SLOViolation, match=r"FAILED min_output_tokens_per_s = 40 < 41"):
        check_slo(run, min_output_tokens_per_s=41.0)


def test_a_latency_nobody_measured_fails_every_bound() -> None:
    run = a_run([])
    assert math.isnan(run.ttft.p50)
    with pytest.raises(SLOViolation, match=r"FAILED ttft p50 = n/a > 10 s; TTFT: none measured"):
        check_slo(run, ttft_p50=10.0)


def test_failures_are_counted_with_their_messages() -> None:
    with pytest.raises(SLOViolation, match=r"FAILED max_failed = 2 > 0; 2 of 5 measured requests failed: "
                                           r"\{'HTTP 503': 2\}"):
        check_slo(a_run([0.1, 0.1, 0.1], num_failed=2), max_failed=0)


def test_bad_bounds_are_errors_that_say_what_exists() -> None:
    with pytest.raises(ValueError, match=r"unknown SLO bound\(s\) \['ttft_p42'\]; known: <latency>_<statistic>"):
        parse_bounds({"ttft_p42": 0.5})
    with pytest.raises(ValueError, match="an SLO needs at least one bound"):
        parse_bounds({})
    with pytest.raises(ValueError, match=r"ttft_p99='fast' must be a finite number >= 0"):
        parse_bounds({"ttft_p99": "fast"})
    with pytest.raises(ValueError, match=r"min_goodput needs the run's SLO"):
        check_slo(a_run([0.1, 0.2, 0.3]), min_goodput=0.9)
