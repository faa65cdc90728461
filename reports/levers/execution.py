"""The execution levers of a run of our engine: each way the calibration timed the served model besides the run's own.

The step calibration (:mod:`probes.step_calibration`) timed, before the load, the run's forward and
each execution variant's (the optimized path for an eager run, a lower-precision dtype, int8/int4
weights, the other attention backend) at several batch sizes and on a prompt chunk, and measured
what each numeric one costs in accuracy. Each becomes a lever here: its flags, what it changes for
the scheduler (a smaller dtype fits more KV blocks in a pool given in MiB), the variant whose
calibrated forward the step model swaps in, and its price.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.execution_variants import ITEMSIZE, NUMERIC_FIELDS
from probes.run_dir import CALIBRATION_NAME
from probes.step_calibration import StepCalibration

NOT_CALIBRATED = ("not predicted: the step calibration did not time it for this run (no "
                  f"{CALIBRATION_NAME}, or one from before execution levers were timed; `servescope diagnose` "
                  "writes it before the load)")
DESCRIPTIONS = {
    "execution": "the {value} execution path",
    "dtype": "{value} weights, activations and KV cache",
    "weights": "{value} weight-only quantized GEMM weights",
    "int4_act_bits": "{value}-bit activations in the int4 kernel",
    "attention_backend": "the {value} attention kernels",
}


def describe(changes: Mapping[str, str | int]) -> str:
    return ", ".join(DESCRIPTIONS.get(k, k + " {value}").format(value=v) for k, v in changes.items())


def execution_lever_specs(calibration: StepCalibration | None, config: Mapping[str, Any],
                          pool_in_blocks: bool) -> list[dict[str, Any]]:
    """One ``reports.levers.predictions.Lever``'s fields per execution lever of a run with engine ``config``.

    ``pool_in_blocks``: the run gave its KV pool in blocks (``--num-kv-blocks``), so a smaller dtype keeps the
    block count; else the pool is MiB and holds more blocks of the smaller dtype.
    """
    if calibration is None:
        return [{"lever": "execution_levers", "flags": "(not calibrated)", "description":
                 "the execution levers this device runs (dtype, quantized weights, path, attention backend)",
                 "is_measured": False, "note": NOT_CALIBRATED}]
    out = []
    for name in calibration.lever_variants():
        changes = calibration.changes(name)
        is_path = set(changes) == {"execution"}
        scheduler_changes: dict[str, Any] = dict(changes) if is_path else {}
        if "dtype" in changes and not pool_in_blocks:
            old, new = ITEMSIZE.get(str(config.get("dtype")), 4), ITEMSIZE[changes["dtype"]]
            scheduler_changes["num_kv_blocks"] = int(config["num_kv_blocks"]) * old // new
        accuracy = calibration.lever_accuracy(name)
        changes_numbers = bool(NUMERIC_FIELDS & set(changes))
        note = timing_note(calibration, name)
        if changes_numbers and accuracy is None:
            why = (calibration.failed or {}).get(name, "the calibration did not measure it")
            note += f"; accuracy cost not measured ({why})"
        out.append({"lever": "execution" if is_path else name,
                    "flags": " ".join(f"--{k.replace('_', '-')} {v}" for k, v in changes.items()),
                    "description": describe(changes), "changes": scheduler_changes, "variant": name,
                    "accuracy": accuracy.to_dict() if accuracy is not None else None,
                    "changes_numbers": changes_numbers, "note": note})
    if calibration.variants is None:
        out.append({"lever": "execution_levers", "flags": "(not calibrated)", "description":
                    "the dtype, quantized-weight and attention-backend levers", "is_measured": False,
                    "note": NOT_CALIBRATED})
    return out


def timing_note(calibration: StepCalibration, name: str) -> str:
    """How the lever's step was measured, in figures."""
    at = calibration.batches[-1]
    run = calibration.run_path
    chunk = ""
    prefill = calibration.prefill_forward_s or {}
    if name in prefill and run in prefill:
        chunk = (f", a {calibration.prefill_tokens}-token prompt chunk {prefill[run] * 1000:.1f} -> "
                 f"{prefill[name] * 1000:.1f} ms")
    return (f"forward calibrated before the load at batch sizes {', '.join(map(str, calibration.batches_of(name)))} "
            f"({calibration.forward(run, at) * 1000:.1f} -> {calibration.forward(name, at) * 1000:.1f} ms at {at}"
            f"{chunk}); a step saves those milliseconds, the rest of the loaded step stays")
