"""The levers' predictions attached to a verdict: the replay for our engine, the flag table for others."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.run_dir import RETEST_NAME, RunDirectory
from reports.dataset import RunDataset
from reports.levers.external import external_predictions
from reports.levers.predictions import Predictions, predict_levers


def engine_kind(data: RunDataset) -> str:
    """Which engine served the run: ``continuous`` (ours, what the replay simulates), ``naive`` or ``static``."""
    workload = data.manifest.workload if data.manifest is not None else None
    if isinstance(workload, Mapping) and workload.get("engine"):
        return str(workload["engine"])
    argv = list(data.load_info.serve_argv or []) if data.load_info is not None else []
    if "--engine" in argv[:-1]:
        return argv[argv.index("--engine") + 1]
    return "continuous"


def attach_predictions(diagnosis: Any, data: RunDataset) -> None:
    """Add the levers' predictions to a verdict (``diagnosis.levers``, ``diagnosis.predictions``).

    With engine steps, the best lever predicted to gain 10% leads the lever to try, with its accuracy cost; when
    none would, the summary says why (a lever not predicted, an idle engine, a step far from its roofline, or, only
    when all of them were predicted and the device agrees, a saturated hardware); from outside, the table lists
    each lever in the server's own flags with what can be predicted without its steps.
    """
    if not getattr(diagnosis, "has_verdict", True):
        return
    if data.has_engine_probes:
        kind = engine_kind(data)
        if kind == "continuous":
            predictions = predict_levers(data, offer_load=diagnosis.bottleneck == "none")
        else:
            predictions = Predictions(
                unknown=f"the replay simulates the continuous-batching engine; this run used the {kind} engine")
    else:
        predictions = external_predictions(data)
    predictions.busy_fraction, predictions.roof_share = device_evidence(diagnosis)
    diagnosis.levers = [lever.to_dict() for lever in predictions.levers]
    diagnosis.predictions = predictions.to_dict()
    add_retest(diagnosis, data)
    if not data.has_engine_probes or predictions.unknown is not None:
        return
    if predictions.best is not None:
        diagnosis.lever = f"{predictions.verdict()} (the evidence: {diagnosis.lever})"
    elif predictions.levers:
        diagnosis.summary = f"{diagnosis.summary}; {predictions.verdict()}"


def add_retest(diagnosis: Any, data: RunDataset) -> None:
    """What a ``--retest`` recorded in this round's ``retest.json``: the lever pulled to reach it
    (``predictions["retest"]``), and what the lever this round named gave when pulled (``measured_gain``)."""
    record = RunDirectory(data.path).read_json(RETEST_NAME) or {}
    if record.get("pulled") is not None:
        diagnosis.predictions = {**(diagnosis.predictions or {}), "retest": record["pulled"]}
    outcome = record.get("outcome")
    if outcome is None:
        return
    for lever in diagnosis.levers:
        if lever["lever"] == outcome.get("lever"):
            lever["measured_gain"] = outcome.get("measured_gain")
            lever["measured"] = outcome.get("measured")


def device_evidence(diagnosis: Any) -> tuple[float | None, float | None]:
    """The engine's busy share of the window and its decode step's roofline floor over the step, from the verdict's
    metrics (None where not measured, or where the peaks were measured low)."""
    metrics = getattr(diagnosis, "metrics", None) or {}
    server = metrics.get("server") or {}
    roofline = metrics.get("roofline") or {}
    floor, step = roofline.get("decode_floor_s"), roofline.get("decode_step_s")
    roof = floor / step if floor is not None and step else None
    return server.get("busy_fraction"), roof if roof is None or roof <= 1.0 else None
