"""The A/B gate names the bottleneck from recorded step tables.

``fixtures/ab/<case>/`` holds both sides' step tables and round times of real `servescope gate --ab`
runs on dummy:tiny (each ``rounds.json`` says the command): a KV pool too small for the batch (cache),
fewer admitted sequences (batching), host time burnt in every step (execution, host).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from reports.gate.bottleneck import name_bottleneck, summarize_side
from reports.gate.verdict import decide, format_verdict

FIXTURES = Path(__file__).parent / "fixtures" / "ab"


def recorded(case: str) -> tuple[pd.DataFrame, list[float], pd.DataFrame, list[float]]:
    rounds = json.loads((FIXTURES / case / "rounds.json").read_text())
    return (pd.read_parquet(FIXTURES / case / "steps_base.parquet"), rounds["base_round_s"],
            pd.read_parquet(FIXTURES / case / "steps_candidate.parquet"), rounds["candidate_round_s"])


@pytest.mark.parametrize(("case", "bottleneck", "phase"), [
    ("cache", "cache", None), ("batching", "batching", None), ("host", "execution", "host")])
def test_recorded_runs_name_their_bottleneck(case: str, bottleneck: str, phase: str | None) -> None:
    verdict = decide(*recorded(case))
    assert not verdict.passed
    assert (verdict.named_bottleneck, verdict.source.phase) == (bottleneck, phase)
    text = format_verdict(verdict, ("base flags", "candidate flags"))
    assert text.splitlines()[-1].startswith("gate: FAIL") and text.splitlines()[-1].endswith(bottleneck)


def test_cache_and_batching_are_told_apart_by_preemption() -> None:
    cache = decide(*recorded("cache"))
    batching = decide(*recorded("batching"))
    assert cache.candidate.preemptions_per_round > cache.base.preemptions_per_round == 0
    assert batching.candidate.preemptions_per_round == batching.base.preemptions_per_round == 0
    assert batching.candidate.peak_seqs == 4 < batching.base.peak_seqs
    for verdict in (cache, batching):
        assert verdict.source.contributions["steps"] > verdict.source.contributions["step_time"]


def test_a_slower_forward_with_the_same_batches_is_execution_forward() -> None:
    base_steps, base_round_s, _, _ = recorded("host")
    # The same recorded steps, each forward 30% longer: the batches are the base's own.
    extra = 0.3 * base_steps["forward_s"]
    slowed = base_steps.assign(forward_s=base_steps["forward_s"] + extra)
    slowed_round_s = [t + extra[base_steps["round"] == r].sum() for r, t in enumerate(base_round_s)]
    source = name_bottleneck(summarize_side(base_steps, base_round_s), summarize_side(slowed, slowed_round_s))
    assert (source.bottleneck, source.phase) == ("execution", "forward")
    assert source.contributions["steps"] == 0


def test_an_unchanged_build_gets_no_bottleneck() -> None:
    base_steps, base_round_s, _, _ = recorded("batching")
    verdict = decide(base_steps, base_round_s, base_steps, base_round_s)
    assert verdict.passed and verdict.named_bottleneck is None
    assert "bottleneck: not named" in format_verdict(verdict, ("a", "b"))


def test_step_tables_without_the_phases_are_refused() -> None:
    base_steps, base_round_s, _, _ = recorded("batching")
    with pytest.raises(ValueError, match=r"lacks columns \['forward_s'\]"):
        summarize_side(base_steps.drop(columns=["forward_s"]), base_round_s)
    with pytest.raises(ValueError, match="unpaired rounds"):
        decide(base_steps, base_round_s, base_steps, base_round_s[:-1])
