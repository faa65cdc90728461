"""The labelled scenario suite: every induced bottleneck is named, from the run directory alone."""

from __future__ import annotations

from collections import Counter

import pytest

from reports.verdict.diagnosis import diagnose
from reports.verdict.evidence import BOTTLENECKS
from tests.reports.scenarios import SCENARIOS


def test_the_suite_covers_every_class_with_three_settings() -> None:
    per_class = Counter(s.expected for s in SCENARIOS)
    assert set(per_class) == set(BOTTLENECKS)
    assert min(per_class.values()) >= 3, per_class
    settings = {(s.kind, repr(sorted(s.engine.items())), repr(s.load)) for s in SCENARIOS}
    assert len(settings) == len(SCENARIOS), "two scenarios share a setting"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_verdict_names_the_induced_bottleneck(scenario, scenario_dir) -> None:
    result = diagnose(scenario_dir(scenario.name))
    detail = {e.name: (e.value, e.passed) for e in result.evidence}
    assert result.bottleneck == scenario.expected, f"{scenario.why}: got {result.bottleneck}, evidence {detail}"
    assert result.source == "engine"
    if result.deciding:  # every deciding rule really passed, and it speaks for the verdict or for its load
        by_name = {e.name: e for e in result.evidence}
        assert all(by_name[n].passed for n in result.deciding)
        assert {by_name[n].bottleneck for n in result.deciding} == {scenario.expected}
    else:  # only the fallback decides by nothing, and it is never confident
        assert result.bottleneck == "none" and result.confidence_label != "high"


@pytest.mark.parametrize("name, lever_word", [("max-num-seqs-1", "max_num_seqs"), ("naive-baseline", "continuous"),
                                              ("contiguous-small-pool", "paged"), ("tiny-pool-preempts", "memory"),
                                              ("host-overhead-20ms", "host")])
def test_the_lever_follows_from_the_evidence(name, lever_word, scenario_dir) -> None:
    assert lever_word in diagnose(scenario_dir(name)).lever
