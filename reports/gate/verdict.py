"""The A/B gate's verdict: the slowdown with its interval, and the bottleneck that the step tables name.

The gate fails only when the interval lies wholly above the threshold (slower by more than it, at
the stated confidence). The bottleneck is named only when the interval lies wholly above zero: a
slowdown nobody measured gets none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from probes.schemas import STEP_PHASES
from reports.gate.bottleneck import SideSteps, SlowdownSource, name_bottleneck, summarize_side
from reports.gate.stats import DEFAULT_CONFIDENCE, Slowdown, estimate_slowdown, format_slowdown

DEFAULT_THRESHOLD = 0.05


@dataclass(frozen=True, slots=True)
class ABVerdict:
    slowdown: Slowdown
    base: SideSteps
    candidate: SideSteps
    source: SlowdownSource

    @property
    def passed(self) -> bool:
        return not self.slowdown.is_regression

    @property
    def named_bottleneck(self) -> str | None:
        """The bottleneck, when the candidate was measured slower at all; else None."""
        return self.source.bottleneck if self.slowdown.is_measured_slower else None

    def to_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "slowdown": self.slowdown.to_dict(), "bottleneck": self.named_bottleneck,
                "phase": self.source.phase if self.named_bottleneck else None, "breakdown": self.source.to_dict(),
                "base": self.base.to_dict(), "candidate": self.candidate.to_dict()}


def decide(base_steps: pd.DataFrame, base_round_s: Sequence[float], candidate_steps: pd.DataFrame,
           candidate_round_s: Sequence[float], threshold: float = DEFAULT_THRESHOLD,
           confidence: float = DEFAULT_CONFIDENCE, ratios: Sequence[float] | None = None) -> ABVerdict:
    """The verdict from both sides' step tables and wall round times (round ``i`` of each is one pair).

    ``ratios`` (one per round) replaces the wall-time ratios in the statistic, e.g. CPU-time ones; the
    bottleneck is always read from the step tables and wall times.
    """
    if len(base_round_s) != len(candidate_round_s):
        raise ValueError(f"unpaired rounds: {len(base_round_s)} base vs {len(candidate_round_s)} candidate")
    if ratios is None:
        ratios = [c / b for b, c in zip(base_round_s, candidate_round_s, strict=True)]
    base, candidate = summarize_side(base_steps, base_round_s), summarize_side(candidate_steps, candidate_round_s)
    return ABVerdict(estimate_slowdown(ratios, threshold, confidence), base, candidate, name_bottleneck(base, candidate))


def format_verdict(verdict: ABVerdict, labels: tuple[str, str]) -> str:
    """Plain text for CI logs: a table of both sides, the slowdown line, the bottleneck line, the verdict line."""
    header = ("side", "round s", "steps/round", "mean batch", "peak seqs", "preempt/round", "step ms",
              *(f"{p} ms" for p in STEP_PHASES), "flags")
    rows = [header]
    for name, side, label in (("base", verdict.base, labels[0]), ("candidate", verdict.candidate, labels[1])):
        rows.append((name, f"{side.round_s:.3f}", f"{side.steps_per_round:.0f}", f"{side.mean_batch:.1f}",
                     str(side.peak_seqs), f"{side.preemptions_per_round:.0f}", f"{side.step_ms:.2f}",
                     *(f"{side.phase_ms[p]:.2f}" for p in STEP_PHASES), label))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    s = verdict.slowdown
    lines.append(f"slowdown: {format_slowdown(s)}")
    if verdict.named_bottleneck:
        lines.append(f"bottleneck: {verdict.source.describe()}")
    else:
        lines.append("bottleneck: not named (the interval does not lie above zero: no slowdown was measured)")
    if verdict.passed:
        lines.append(f"gate: pass (the interval does not lie above {s.threshold:.0%})")
    else:
        lines.append(f"gate: FAIL: the candidate is slower by more than {s.threshold:.0%} "
                     f"(interval {s.low:+.1%} .. {s.high:+.1%}), {verdict.named_bottleneck}")
    return "\n".join(lines)
