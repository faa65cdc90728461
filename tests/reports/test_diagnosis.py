"""diagnosis.json's contract, the schema round trip, and the decision mechanics."""

from __future__ import annotations

import json

import pytest

from reports.html.report import write_report
from reports.verdict.diagnosis import Diagnosis, diagnose
from reports.verdict.evidence import BOTTLENECKS, Evidence
from reports.verdict.findings import ENGINE_FINDINGS, Finding, check_rule_names
from reports.verdict.rules import RULES, rule


def evidence(name: str, passed: bool | None) -> Evidence:
    return Evidence(name, "batching", None if passed is None else 1.0, 0.5, ">=", passed, "", "")


def test_diagnosis_json_meets_the_design_contract(scenario_dir) -> None:
    path = scenario_dir("host-overhead-20ms")
    returned = write_report(path)
    written = json.loads((path / "diagnosis.json").read_text())
    assert written == returned
    assert written["bottleneck"] in BOTTLENECKS and written["bottleneck"] == "execution"
    assert isinstance(written["evidence"], list) and isinstance(written["metrics"], dict)
    for item in written["evidence"]:
        assert {"name", "value", "threshold", "passed", "why", "summary"} <= set(item)
    assert written["metrics"]["server"]["overhead_share"] > 0.5
    assert (path / "report.html").is_file()


def test_the_schema_round_trips_through_json(scenario_dir) -> None:
    result = diagnose(scenario_dir("tiny-pool-preempts"))
    again = Diagnosis.from_json(result.to_json())
    assert again.to_dict() == Diagnosis.from_json(again.to_json()).to_dict()
    assert again.bottleneck == result.bottleneck and again.deciding == result.deciding
    assert [e.name for e in again.evidence] == [e.name for e in result.evidence]


def test_an_unknown_bottleneck_is_refused() -> None:
    with pytest.raises(ValueError, match="bottleneck must be one of"):
        Diagnosis.from_dict({"bottleneck": "network"})


def test_every_rule_states_its_reason_once_and_an_unknown_name_fails_loudly() -> None:
    assert all(r.why and r.name for r in RULES)
    assert len({r.name for r in RULES}) == len(RULES)
    assert rule("host_overhead").name == "host_overhead"
    with pytest.raises(ValueError, match="no rule named 'host_overheads'; the rules: .*host_overhead"):
        rule("host_overheads")


def test_every_finding_names_listed_rules() -> None:
    for finding in ENGINE_FINDINGS:
        assert set(finding.all_of + finding.any_of + finding.support) <= {r.name for r in RULES}
    with pytest.raises(ValueError, match="no rule named 'no_such_rule'"):
        check_rule_names(Finding("none", all_of=("engine_idle",)), Finding("none", all_of=("no_such_rule",)))


def test_a_finding_needs_all_of_and_one_of_any_of() -> None:
    finding = Finding("batching", all_of=("a", "b"), any_of=("c", "d"), unknown_ok=("b",))
    base = {"a": evidence("a", True), "b": evidence("b", True), "c": evidence("c", False), "d": evidence("d", True)}
    assert finding.fires(base)
    assert finding.fires({**base, "b": evidence("b", None)})  # unmeasurable, and allowed to be
    assert not finding.fires({**base, "a": evidence("a", None)})  # unmeasurable, not allowed
    assert not finding.fires({**base, "d": evidence("d", False)})
    assert [e.name for e in finding.deciding(base)] == ["a", "b", "d"]


def test_the_engine_fallback_with_a_queue_does_not_say_nothing_binds() -> None:
    """No finding held, yet requests waited: the summary says the load is not the limit and the bottleneck is
    undecided, never "nothing inside the server binds" (a claim the queue contradicts)."""
    from types import SimpleNamespace

    from reports.verdict.advice import lever_for
    from reports.verdict.evidence import Facts

    def summary(waiting_share: float) -> str:
        server = SimpleNamespace(waiting_share=waiting_share, busy_fraction=0.99)
        return lever_for("none", Facts(server=server, client=None, prometheus=None, roofline=None), [])[1]

    assert "undecided" in summary(0.83) and "83%" in summary(0.83) and "nothing inside" not in summary(0.83)
    assert "nothing inside the server binds" in summary(0.0)
