"""The verdict: which bottleneck (batching, cache, execution) holds the server back, or none.

The findings (reports.verdict.findings) are tried in their order on one point's facts
(reports.verdict.facts): the first whose rules pass is the verdict; if none does, nothing inside the
server binds and the load is the limit (``none``). Every rule's evidence goes into the result,
passed or not.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.run_dir import DIAGNOSIS_NAME, RunDirectory, json_safe
from probes.single_stream import SINGLE_STREAM_NAME, SingleStream
from reports.ablation import AblationTable, ablation_table, read_ablation_index
from reports.capacity.records import Capacity, read_search
from reports.capacity.result import capacity_focus, capacity_result
from reports.dataset import RunDataset, load_points, sweep_parameter
from reports.health import RunHealth, run_health
from reports.levers.attach import attach_predictions
from reports.levers.engine_speed import SLOWED_FACTOR, attach_engine_speed
from reports.metric_adapters import ADAPTERS
from reports.summary import RunSummary, point_measures
from reports.verdict.advice import is_undecided, lever_for
from reports.verdict.evidence import BOTTLENECKS, NO_VERDICT, Bottleneck, Evidence, Facts, SweepMeasures, num
from reports.verdict.facts import facts_for, single_stream_tpot, sweep_measures
from reports.verdict.findings import (
    CAPACITY_FINDINGS,
    CLIENT_FINDINGS,
    ENGINE_FALLBACK,
    ENGINE_FINDINGS,
    EXTERNAL_FALLBACK,
    METRICS_FINDINGS,
    OVERLOAD_FINDINGS,
    SWEEP_FINDINGS,
    Finding,
)
from reports.verdict.rules import RULES

# How much a verdict can be trusted from each kind of data, before the evidence's own margins.
SOURCE_TRUST = {"engine": 1.0, "prometheus": 0.8, "capacity": 0.7, "sweep": 0.7, "client": 0.5}


@dataclass(slots=True)
class Diagnosis:
    """The verdict on one run (or sweep) directory; saved as ``diagnosis.json``."""

    bottleneck: Bottleneck | str  # one of BOTTLENECKS, or NO_VERDICT for a run that cannot be judged
    confidence: float  # 0..1
    confidence_label: str  # high / medium / low
    lever: str  # what to change first
    summary: str
    source: str  # what the verdict rests on: engine, prometheus, sweep or client
    evidence: list[Evidence]  # deciding evidence first, then every other rule evaluated
    deciding: list[str]  # names of the rules that made the verdict
    also: list[str]  # other bottlenecks whose findings also fired
    metrics: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    levers: list[dict[str, Any]] = field(default_factory=list)  # reports.levers.predictions.LeverPrediction, best first
    predictions: dict[str, Any] | None = None  # the step model, the replay check and the predicted verdict
    capacity: dict[str, Any] | None = None  # reports.capacity.records.Capacity, after a capacity search

    @property
    def has_verdict(self) -> bool:
        return self.bottleneck != NO_VERDICT

    def to_dict(self) -> dict[str, Any]:
        return {"bottleneck": self.bottleneck, "confidence": self.confidence,
                "confidence_label": self.confidence_label, "lever": self.lever, "summary": self.summary,
                "source": self.source, "evidence": [e.to_dict() for e in self.evidence], "deciding": self.deciding,
                "also": self.also, "metrics": self.metrics, "label": self.label, "levers": self.levers,
                "predictions": self.predictions, "capacity": self.capacity}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosis:
        if data.get("bottleneck") not in (*BOTTLENECKS, NO_VERDICT):
            raise ValueError(f"bottleneck must be one of {(*BOTTLENECKS, NO_VERDICT)}, got {data.get('bottleneck')!r}")
        return cls(bottleneck=data["bottleneck"], confidence=float(data["confidence"]),
                   confidence_label=data["confidence_label"], lever=data["lever"], summary=data["summary"],
                   source=data["source"], evidence=[Evidence.from_dict(e) for e in data["evidence"]],
                   deciding=list(data["deciding"]), also=list(data["also"]), metrics=dict(data["metrics"]),
                   label=data.get("label", ""), levers=list(data.get("levers") or []),
                   predictions=data.get("predictions"), capacity=data.get("capacity"))

    def to_json(self) -> str:
        return json.dumps(json_safe(self.to_dict()), indent=2, sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Diagnosis:
        return cls.from_dict(json.loads(text))


def decide(facts: Facts, label: str = "") -> Diagnosis:
    """Apply the findings in order to one point's facts."""
    evidence = {r.name: r.evaluate(facts) for r in RULES}
    if facts.server is not None:
        source, findings, fallback = "engine", (*ENGINE_FINDINGS, *CAPACITY_FINDINGS), ENGINE_FALLBACK
    else:
        findings = ((*METRICS_FINDINGS, *CAPACITY_FINDINGS, *SWEEP_FINDINGS) if facts.prometheus
                    else (*OVERLOAD_FINDINGS, *CAPACITY_FINDINGS, *SWEEP_FINDINGS, *CLIENT_FINDINGS))
        fallback = EXTERNAL_FALLBACK
        source = "prometheus" if facts.prometheus else "sweep" if facts.sweep else "client"
    fired = [f for f in findings if f.fires(evidence)]
    chosen = fired[0] if fired else fallback
    if facts.server is None and chosen in CAPACITY_FINDINGS:
        source = "capacity"
    deciding = chosen.deciding(evidence)
    names = [*chosen.all_of, *chosen.any_of, *chosen.support]
    relevant = [evidence[n] for n in dict.fromkeys(names)]
    others = [e for n, e in evidence.items() if n not in names and e.passed is not None]
    also = sorted({f.bottleneck for f in fired[1:]} - {chosen.bottleneck})
    confidence = _confidence(source, chosen, evidence, deciding, fired_at_all=bool(fired), num_conflicts=len(also))
    lever, summary = lever_for(chosen.bottleneck, facts, deciding)
    parts = (("server", facts.server), ("client", facts.client), ("prometheus", facts.prometheus),
             ("roofline", facts.roofline), ("sweep", facts.sweep), ("execution_paths", facts.execution_paths),
             ("execution_reference", facts.execution_reference))
    metrics = {"source": source, "metrics_read": metrics_read(facts),
               **{k: (v.to_dict() if v is not None else None) for k, v in parts}}
    return Diagnosis(bottleneck=chosen.bottleneck, confidence=confidence, confidence_label=_label(confidence),
                     lever=lever, summary=summary, source=source, evidence=[*relevant, *others],
                     deciding=[e.name for e in deciding], also=also, metrics=metrics, label=label)


def metrics_read(facts: Facts) -> str | None:
    """One sentence on what the server's ``/metrics`` gave the verdict; None when nothing was scraped."""
    p = facts.prometheus
    if p is not None:
        names = ", ".join(f"{signal} {name}" for signal, name in p.names.items() if name is not None)
        extra = [f"{label} {num(value)}" for label, value in (
            ("sequences per forward step", p.mean_batch), ("generated tok/s by its counter", p.output_tokens_per_s),
            ("longest sequence (tokens)", p.max_sequence_tokens)) if value is not None]
        info = facts.server_info
        if info is not None and info.num_slots is not None:
            extra.append(f"{info.num_slots} slots of {info.slot_context} tokens (/props)")
        return f"/metrics read with the {p.adapter} names ({names})" + (f"; {', '.join(extra)}" if extra else "")
    if facts.is_metrics_unread:
        return (f"/metrics was scraped, but none of its names is one of the known servers' "
                f"({', '.join(ADAPTERS)}): the client-side evidence decided")
    return None


def diagnose_dataset(data: RunDataset, sweep: SweepMeasures | None = None) -> Diagnosis:
    return decide(facts_for(data, point_measures(data), sweep), data.label)


@dataclass(slots=True)
class Analysis:
    """A run, sweep or ablation directory, loaded once, measured once and judged.

    ``points`` are the load points in order of load (an ablation's: its baseline variant's);
    ``summary`` holds their measures and ``facts`` those the verdict read, at the heaviest point.
    """

    root: Path
    points: list[RunDataset]
    summary: RunSummary
    facts: Facts
    diagnosis: Diagnosis
    point_verdicts: list[Diagnosis]  # one per point (the verdict itself for a single point)
    ablation: AblationTable | None = None
    capacity: Capacity | None = None
    focus_index: int = -1  # the point the verdict is about

    @property
    def focus(self) -> RunDataset:
        return self.points[self.focus_index]


def analyze(path: str | os.PathLike[str], view: str = "inside") -> Analysis:
    """Load, measure and judge the directory at ``path``: a run, a sweep (``sweep.json``) or an ablation.

    A sweep is judged at its heaviest point, where a limit shows most, with the way throughput,
    TTFT and TPOT move across the points as evidence; every point's own verdict is in
    ``metrics["points"]``. An ablation directory (``ablation.json``) is judged by its baseline
    variant, with the ablation table in ``metrics["ablation"]``.
    """
    root = Path(path)
    index = read_ablation_index(root)
    run_path = root / index.baseline_dir if index is not None else root
    points = sorted(load_points(run_path), key=lambda p: p.concurrency or 0.0)
    parameter = sweep_parameter(run_path)
    measures = [point_measures(p) for p in points]
    reference = RunDirectory(run_path).load(SINGLE_STREAM_NAME, SingleStream)
    alone = single_stream_tpot(measures, reference)
    point_facts = [facts_for(p, m, view=view, single_stream_tpot_s=alone) for p, m in zip(points, measures, strict=True)]
    health = run_health(points, measures, reference.failed_share if reference is not None else None)
    if not health.can_judge:
        verdicts = [no_verdict(health, f, p.label) for p, f in zip(points, point_facts, strict=True)]
        return Analysis(root=root, points=points, summary=RunSummary(parameter, measures), facts=point_facts[-1],
                        diagnosis=verdicts[-1], point_verdicts=verdicts)
    verdicts = [decide(f, p.label) for p, f in zip(points, point_facts, strict=True)]
    sweep = sweep_measures(parameter or "load", measures) if len(points) > 1 else None
    search = read_search(run_path)
    capacity = capacity_result(run_path, search, points, measures) if search is not None else None
    if capacity is not None:
        attach_engine_speed(capacity, points)
    focus = capacity_focus(capacity, measures) if capacity is not None else len(points) - 1
    # NOTE: the focus point's facts with the sweep's evidence added; its roofline is not recomputed.
    facts = dataclasses.replace(point_facts[focus], sweep=sweep, capacity=capacity)
    diagnosis = decide(facts, points[focus].label) if sweep is not None or capacity else verdicts[focus]
    slowed = slowed_users(capacity) if capacity is not None else {}
    focus_slowed = slowed.get(int(points[focus].concurrency or 0))
    if capacity is not None and (is_undecided(diagnosis.bottleneck, facts) or focus_slowed is not None):
        lighter = decided_lighter_point(focus, points, point_facts, sweep, capacity, slowed)
        if lighter is not None:
            first = points[focus].label
            focus, facts, diagnosis, passed_over = lighter
            at_first = (f"the host ran the engine slower ({focus_slowed:.2f}x the search's median point), so its "
                        f"reading is not this server's" if focus_slowed is not None else
                        "which limit binds was undecided (requests queued, yet no bottleneck's evidence was complete)")
            why = (f"at {first}, where the capacity's rules read the verdict, {at_first}; {points[focus].label} is "
                   f"the heaviest lighter point whose evidence decides it")
            if passed_over:
                why += f" ({', '.join(passed_over)} passed over: the host ran the engine slower there)"
            diagnosis.metrics["verdict_point"] = {"label": points[focus].label, "instead_of": first, "why": why}
            diagnosis.summary = f"{diagnosis.summary} (read at {points[focus].label}: {why})"
    diagnosis.capacity = capacity.to_dict() if capacity is not None else None
    if health.notes:
        diagnosis.metrics["health_notes"] = health.notes
        diagnosis.summary = f"{diagnosis.summary} ({'; '.join(health.notes)})"
    if health.failures:
        diagnosis.metrics["failures"] = health.failures
    if len(points) > 1:
        diagnosis.metrics["points"] = [
            {"label": m.label, "concurrency": m.concurrency, "bottleneck": v.bottleneck, "confidence": v.confidence}
            for m, v in zip(measures, verdicts, strict=True)]
    ablation = None
    if index is not None:
        ablation = ablation_table(root, verdict=lambda point: diagnose_dataset(point).bottleneck)
        diagnosis.metrics["ablation"] = ablation.to_dict() if ablation is not None else None
    attach_predictions(diagnosis, points[focus])
    return Analysis(root=root, points=points, summary=RunSummary(parameter, measures), facts=facts,
                    diagnosis=diagnosis, point_verdicts=verdicts, ablation=ablation, capacity=capacity,
                    focus_index=focus)



def decided_lighter_point(focus: int, points: list[RunDataset], point_facts: list[Facts], sweep: SweepMeasures | None,
                          capacity: Capacity, slowed: dict[int, float]) -> tuple[int, Facts, Diagnosis, list[str]] | None:
    """The heaviest point lighter than ``focus`` whose evidence (with the sweep's and the capacity's) names a limit:
    its index, facts and verdict, and the labels of the points passed over because the host ran the engine slower
    under them (``slowed``: :func:`slowed_users` of ``capacity``). None when the first point on the way down that
    is not undecided names no limit (the offered load was the limit there), or no point does."""
    passed_over = []
    for i in range(focus - 1, -1, -1):
        if int(points[i].concurrency or 0) in slowed:
            passed_over.append(points[i].label)
            continue
        facts = dataclasses.replace(point_facts[i], sweep=sweep, capacity=capacity)
        diagnosis = decide(facts, points[i].label)
        if is_undecided(diagnosis.bottleneck, facts):
            continue
        return (i, facts, diagnosis, passed_over) if diagnosis.bottleneck != "none" else None
    return None


def slowed_users(capacity: Capacity) -> dict[int, float]:
    """The search's points the host ran the engine slower under (``engine_slowdown`` at :data:`SLOWED_FACTOR` or
    more), by users, with that slowdown."""
    return {p.users: p.engine_slowdown for p in capacity.points
            if p.engine_slowdown is not None and p.engine_slowdown >= SLOWED_FACTOR}


def no_verdict(health: RunHealth, facts: Facts, label: str = "") -> Diagnosis:
    """What a run that cannot be judged gets: no bottleneck, and why (``metrics["health"]``)."""
    metrics = {"source": None, "health": health.to_dict(),
               **{k: (v.to_dict() if v is not None else None) for k, v in (
                   ("server", facts.server), ("client", facts.client), ("prometheus", facts.prometheus))}}
    return Diagnosis(bottleneck=NO_VERDICT, confidence=0.0, confidence_label="none",
                     lever="make the requests succeed first (see the failures above), then measure again",
                     summary=f"no verdict: {health.describe()}", source="none", evidence=[], deciding=[], also=[],
                     metrics=metrics, label=label)


def diagnose(path: str | os.PathLike[str], view: str = "inside") -> Diagnosis:
    """The verdict on a run directory, a sweep directory as a whole, or an ablation (see :func:`analyze`)."""
    return analyze(path, view).diagnosis



def _confidence(source: str, chosen: Finding, evidence: dict[str, Evidence], deciding: list[Evidence],
                fired_at_all: bool, num_conflicts: int) -> float:
    """Trust in the data source, times how clearly the deciding figures pass and how many supports agree."""
    trust = SOURCE_TRUST[source]
    supports = [evidence[n] for n in chosen.support if evidence[n].passed is not None]
    support_share = sum(bool(e.passed) for e in supports) / len(supports) if supports else 0.0
    if not fired_at_all:  # the fallback: no finding fired, the verdict is what is left
        return round(trust * (0.35 + 0.25 * support_share), 3)
    margin = sum(e.margin for e in deciding) / len(deciding) if deciding else 0.0
    value = trust * (0.55 + 0.35 * margin + 0.1 * support_share) * (0.85 ** num_conflicts)
    return round(min(value, 1.0), 3)


def _label(confidence: float) -> str:
    return "high" if confidence >= 0.75 else "medium" if confidence >= 0.5 else "low"


def write_diagnosis(path: str | os.PathLike[str], diagnosis: Diagnosis) -> Path:
    return RunDirectory(path).save(DIAGNOSIS_NAME, diagnosis)


def read_diagnosis(path: str | os.PathLike[str]) -> Diagnosis:
    return RunDirectory(path).load(DIAGNOSIS_NAME, Diagnosis) or _missing(Path(path) / DIAGNOSIS_NAME)


def _missing(path: Path) -> Diagnosis:
    raise FileNotFoundError(f"{path} is missing: run `servescope report {path.parent}` first")
