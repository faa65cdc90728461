"""Where an A/B slowdown went: the step tables of both sides name the bottleneck.

Both sides ran the same requests, so a round's time splits into how many steps it took and how long
a step took (and a little time outside the engine's steps):

- more steps for the same work means smaller batches: **cache** when the candidate preempted more or
  ran out of free KV blocks with requests waiting, else **batching** (its scheduler admitted fewer);
- the same steps, each slower, is **execution**, and the phase whose time per step grew most says
  where (schedule, prepare, forward, sample, output, or host: time burnt around the forward).

The step tables are the engine's step rows (``probes.schemas.STEPS`` columns) with a ``round`` column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from probes.schemas import STEP_PHASES
from reports.verdict.evidence import BATCHING, CACHE, EXECUTION, Bottleneck

# NOTE: a KV-bound candidate shows it in most steps; a few exhausted steps at a round's peak are noise.
KV_EXHAUSTED_SHARE_DELTA = 0.05


@dataclass(frozen=True, slots=True)
class SideSteps:
    """One side's steps, each figure the median over rounds of that round's value."""

    round_s: float
    steps_per_round: float
    step_ms: float  # mean step time
    phase_ms: dict[str, float]  # mean time per step in each phase
    mean_batch: float
    peak_seqs: int
    preemptions_per_round: float
    kv_exhausted_share: float  # steps that left no KV block free while requests waited

    def to_dict(self) -> dict[str, object]:
        return {"round_s": self.round_s, "steps_per_round": self.steps_per_round, "step_ms": self.step_ms,
                "phase_ms": self.phase_ms, "mean_batch": self.mean_batch, "peak_seqs": self.peak_seqs,
                "preemptions_per_round": self.preemptions_per_round,
                "kv_exhausted_share": self.kv_exhausted_share}


@dataclass(frozen=True, slots=True)
class SlowdownSource:
    """The bottleneck the slowdown points to (None when no part of it grew) and the figures that say so."""

    bottleneck: Bottleneck | None
    phase: str | None
    contributions: dict[str, float]  # log-ratio of the round time from: steps, step_time, outside
    evidence: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.bottleneck is None:
            return "none: neither the steps per round nor the time per step grew"
        where = f" ({self.phase})" if self.phase else ""
        return f"{self.bottleneck}{where}: " + "; ".join(self.evidence)

    def to_dict(self) -> dict[str, object]:
        return {"bottleneck": self.bottleneck, "phase": self.phase, "contributions": self.contributions,
                "evidence": self.evidence}


def summarize_side(steps: pd.DataFrame, round_s: Sequence[float]) -> SideSteps:
    """Per-round figures of one side's step table, then their medians; ``round_s[i]`` is round ``i``'s wall time."""
    missing = {"round", "num_seqs", "num_preemptions", *STEP_PHASES.values()} - set(steps.columns)
    missing.discard("host_overhead_s")  # NOTE: an older build records no calibration knob; it burnt nothing
    if missing:
        raise ValueError(f"step table lacks columns {sorted(missing)}")
    if steps.empty:
        raise ValueError("step table is empty: the side ran no engine step")
    steps = steps if "host_overhead_s" in steps else steps.assign(host_overhead_s=0.0)
    steps = steps.assign(total_s=steps[list(STEP_PHASES.values())].sum(axis=1),
                         kv_exhausted=_kv_exhausted(steps))
    per_round = steps.groupby("round").agg(
        num_steps=("total_s", "size"), step_s=("total_s", "mean"), mean_batch=("num_seqs", "mean"),
        peak_seqs=("num_seqs", "max"), preemptions=("num_preemptions", "sum"),
        kv_exhausted_share=("kv_exhausted", "mean"),
        **{name: (column, "mean") for name, column in STEP_PHASES.items()})
    return SideSteps(
        round_s=float(pd.Series(list(round_s)).median()),
        steps_per_round=float(per_round["num_steps"].median()), step_ms=1e3 * float(per_round["step_s"].median()),
        phase_ms={name: 1e3 * float(per_round[name].median()) for name in STEP_PHASES},
        mean_batch=float(per_round["mean_batch"].median()), peak_seqs=int(per_round["peak_seqs"].max()),
        preemptions_per_round=float(per_round["preemptions"].median()),
        kv_exhausted_share=float(per_round["kv_exhausted_share"].median()),
    )


def _kv_exhausted(steps: pd.DataFrame) -> pd.Series:
    if {"num_kv_blocks_free", "num_waiting"} <= set(steps.columns):
        return (steps["num_kv_blocks_free"] == 0) & (steps["num_waiting"] > 0)
    return pd.Series(False, index=steps.index)


def name_bottleneck(base: SideSteps, candidate: SideSteps) -> SlowdownSource:
    """Split the candidate's round time over the base's into steps, time per step and the rest; name the largest."""
    total = math.log(candidate.round_s / base.round_s)
    steps = math.log(candidate.steps_per_round / base.steps_per_round)
    step_time = math.log(candidate.step_ms / base.step_ms)
    contributions = {"steps": steps, "step_time": step_time, "outside": total - steps - step_time}
    shape = (f"steps per round {base.steps_per_round:.0f} -> {candidate.steps_per_round:.0f}, "
             f"mean batch {base.mean_batch:.1f} -> {candidate.mean_batch:.1f} seqs, "
             f"step {base.step_ms:.2f} -> {candidate.step_ms:.2f} ms")
    cache = (f"preemptions per round {base.preemptions_per_round:.0f} -> {candidate.preemptions_per_round:.0f}, "
             f"steps with the KV pool exhausted {base.kv_exhausted_share:.0%} -> {candidate.kv_exhausted_share:.0%}")
    largest = max(contributions, key=lambda k: contributions[k])
    if contributions[largest] <= 0:
        return SlowdownSource(None, None, contributions, [shape])
    if largest == "steps":
        is_cache = (candidate.preemptions_per_round > base.preemptions_per_round
                    or candidate.kv_exhausted_share > base.kv_exhausted_share + KV_EXHAUSTED_SHARE_DELTA)
        return SlowdownSource(CACHE if is_cache else BATCHING, None, contributions, [shape, cache])
    if largest == "outside":
        outside_ms = (f"time outside the engine's steps per round "
                      f"{_outside_ms(base):.0f} -> {_outside_ms(candidate):.0f} ms")
        return SlowdownSource(EXECUTION, "outside steps", contributions, [outside_ms, shape])
    growth = {name: candidate.phase_ms[name] - base.phase_ms[name] for name in STEP_PHASES}
    phase = max(growth, key=lambda k: growth[k])
    grew = (f"{phase} {base.phase_ms[phase]:.2f} -> {candidate.phase_ms[phase]:.2f} ms per step "
            f"({growth[phase]:+.2f} of {candidate.step_ms - base.step_ms:+.2f} ms)")
    return SlowdownSource(EXECUTION, phase, contributions, [grew, shape])


def _outside_ms(side: SideSteps) -> float:
    return 1e3 * side.round_s - side.steps_per_round * side.step_ms
