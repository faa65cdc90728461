"""One verdict from inside and outside: the same run judged from the engine's probes and from its clients.

Each labelled scenario is driven once with the engine probes on and the engine's own ``/metrics``
scraped over HTTP; ``view="inside"`` is what ``servescope diagnose`` reads, ``view="outside"`` what
``servescope load --target`` reads (client rows, ``/metrics``, and the target's decode step timed in
turns with servescope's optimized path). The SmolLM2-shaped eager scenario is the slow one.
"""

from __future__ import annotations

from collections import Counter

import pytest

from reports.verdict.diagnosis import diagnose
from tests.reports.agreement import AGREEMENT, SLOW

CASES = [pytest.param(s, id=s.name, marks=[pytest.mark.slow] if s.name in SLOW else []) for s in AGREEMENT]


def test_the_agreement_suite_covers_every_class() -> None:
    labels = Counter(s.expected for s in AGREEMENT)
    assert set(labels) == {"batching", "cache", "execution", "none"} and len(AGREEMENT) >= 6, labels


@pytest.mark.parametrize("scenario", CASES)
def test_inside_and_outside_name_the_label(scenario, agreement_dir) -> None:
    path = agreement_dir(scenario.name)
    inside, outside = diagnose(path, "inside"), diagnose(path, "outside")
    detail = {view.source: {e.name: (e.value, e.passed) for e in view.evidence} for view in (inside, outside)}
    assert (inside.bottleneck, outside.bottleneck) == (scenario.expected, scenario.expected), \
        f"{scenario.why}: inside {inside.bottleneck}, outside {outside.bottleneck}; evidence {detail}"
    assert inside.source == "engine" and outside.source == "prometheus"
    assert outside.metrics["server"] is None and outside.metrics["roofline"] is None  # nothing from the probes


def test_a_transient_queue_is_not_a_limit_from_outside(agreement_dir) -> None:
    """8 closed-loop users on 16 seats: the gauge sees the next request waiting for one step, not a limit."""
    outside = diagnose(agreement_dir("transient-queue"), "outside")
    by_name = {e.name: e for e in outside.evidence}
    assert by_name["server_queue_depth"].passed is False
    assert "server_queue_depth" not in outside.deciding and outside.bottleneck == "none"
    if by_name["server_queue"].passed:  # sustained but shallow: the summary says which, never "under" its bound
        assert "not a limit" in outside.summary and "marks a limit" in outside.summary, outside.summary


def test_the_outside_execution_evidence_is_timed_in_turns(agreement_dir) -> None:
    outside = diagnose(agreement_dir("host-overhead"), "outside")
    assert outside.deciding == ["slower_than_optimized"]
    reference = outside.metrics["execution_reference"]
    assert set(reference["step_s"]) == {"optimized", "target"} and reference["num_steps"] >= 3
    assert reference["step_s"]["target"] > reference["step_s"]["optimized"]
    assert "would remove" in outside.summary


@pytest.mark.slow
def test_eager_is_execution_and_says_what_the_optimized_path_removes(agreement_dir) -> None:
    """The same load on the eager and on the optimized path of one model: only eager is held by execution."""
    eager, optimized = diagnose(agreement_dir("eager")), diagnose(agreement_dir("optimized"))
    assert eager.bottleneck == "execution" and "optimized_path_removes" in eager.deciding
    removed = next(e for e in eager.evidence if e.name == "optimized_path_removes")
    assert removed.value >= 0.3 and "would remove" in eager.summary and f"{removed.value:.0%}" in eager.summary
    assert optimized.bottleneck != "execution"
    assert next(e for e in optimized.evidence if e.name == "optimized_path_removes").value == 0.0
