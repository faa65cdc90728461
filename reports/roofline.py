"""Roofline position of each engine step: bytes moved and FLOPs done, against this machine's measured peaks.

Per step (a Llama decoder, weights in the run's dtype):

* bytes = weight bytes (every weight is read once per step, whatever the batch)
  + KV read (each running sequence reads its whole context: ``num_kv_slots_used * kv_bytes_per_token``)
  + KV written (one entry per token computed).
* FLOPs = 2 * decoder-layer parameters * tokens computed (every token goes through every matmul)
  + 2 * vocab * hidden per sequence sampled (the LM head runs on the last token of each)
  + attention: 4 * layers * heads * head_dim per (query token, context token) pair, with a
  decode token seeing its sequence's whole context and a prefill token, on average, half of it.

MBU = (bytes / step time) / peak bandwidth and MFU = (FLOPs / step time) / peak FLOP/s, over the
whole step (host time included: a step that spends its time on the host is far from both roofs).
A step's floor is the slower roof's time for its work, max(bytes / bandwidth, FLOPs / FLOP/s):
no execution path does the step faster on this machine. NOTE: MBU and MFU above 1 are impossible;
they mean the peaks were measured low (``RooflineSummary.above_roof``).
The peaks (:mod:`probes.peaks`) were measured before the run on the machine that served it, and
the model's shape (:mod:`probes.model_shape`) is recorded in its manifest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from probes.model_shape import ModelShape
from probes.peaks import MachinePeaks


def step_work(steps: pd.DataFrame, shape: ModelShape) -> pd.DataFrame:
    """Per step: bytes moved, FLOPs, arithmetic intensity, achieved bandwidth and FLOP/s (see the module doc)."""
    tokens = (steps["num_prefill_tokens"] + steps["num_decode_tokens"]).to_numpy(dtype=float)
    context = steps["num_kv_slots_used"].to_numpy(dtype=float)
    running = np.maximum(steps["num_running"].to_numpy(dtype=float), 1.0)
    mean_context = context / running
    kv_bytes = (context + tokens) * shape.kv_bytes_per_token
    bytes_moved = shape.weight_bytes + kv_bytes
    attention_pairs = (steps["num_decode_tokens"].to_numpy(dtype=float) * mean_context
                       + steps["num_prefill_tokens"].to_numpy(dtype=float) * mean_context / 2)
    flops = (2 * shape.num_layer_params * tokens + 2 * shape.vocab_size * shape.hidden_size * steps["num_seqs"]
             + 4 * shape.num_layers * shape.num_heads * shape.head_dim * attention_pairs)
    step_s = steps["total_s"].to_numpy(dtype=float)
    return pd.DataFrame({
        "start_time": steps["start_time"].to_numpy(), "kind": np.where(steps["num_prefill_tokens"] > 0,
                                                                       "prefill", "decode"),
        "bytes": bytes_moved, "flops": np.asarray(flops, dtype=float),
        "intensity": np.asarray(flops, dtype=float) / bytes_moved,
        "bandwidth": bytes_moved / step_s, "flops_per_s": np.asarray(flops, dtype=float) / step_s,
        "forward_bandwidth": bytes_moved / steps["forward_s"].to_numpy(dtype=float), "step_s": step_s,
    })


def floor_seconds(work: pd.DataFrame, peaks: MachinePeaks) -> pd.Series:
    """Per step, the least time its bytes and FLOPs need at the peaks: the slower of the two roofs."""
    return np.maximum(work["bytes"] / peaks.bandwidth_bytes_per_s, work["flops"] / peaks.flops_per_s)


@dataclass(slots=True)
class RooflineSummary:
    """Median MBU and MFU of decode and of prefill steps (None where the run had no such step)."""

    model: ModelShape
    peaks: MachinePeaks | None
    decode_mbu: float | None
    decode_mfu: float | None
    prefill_mbu: float | None
    prefill_mfu: float | None
    decode_forward_mbu: float | None  # the forward pass alone, host phases left out
    num_decode_steps: int
    num_prefill_steps: int
    decode_step_s: float | None = None  # median decode step, host phases and all
    decode_floor_s: float | None = None  # median time a decode step's bytes and FLOPs need at the peaks

    @property
    def above_roof(self) -> dict[str, float]:
        """Shares of a roof above 1, which no step can reach: the peaks were measured low."""
        named = {"decode MBU": self.decode_mbu, "decode MFU": self.decode_mfu, "prefill MBU": self.prefill_mbu,
                 "prefill MFU": self.prefill_mfu, "decode forward MBU": self.decode_forward_mbu}
        return {name: value for name, value in named.items() if value is not None and value > 1.0}

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "peaks": self.peaks.to_dict() if self.peaks else None,
                **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("model", "peaks")}}


def roofline_summary(work: pd.DataFrame, shape: ModelShape, peaks: MachinePeaks | None) -> RooflineSummary:
    decode, prefill = work[work["kind"] == "decode"], work[work["kind"] == "prefill"]

    def median_ratio(frame: pd.DataFrame, column: str, peak: float | None) -> float | None:
        return float(frame[column].median()) / peak if len(frame) and peak else None

    bw = peaks.bandwidth_bytes_per_s if peaks else None
    fl = peaks.flops_per_s if peaks else None
    return RooflineSummary(
        model=shape, peaks=peaks, decode_mbu=median_ratio(decode, "bandwidth", bw),
        decode_mfu=median_ratio(decode, "flops_per_s", fl), prefill_mbu=median_ratio(prefill, "bandwidth", bw),
        prefill_mfu=median_ratio(prefill, "flops_per_s", fl),
        decode_forward_mbu=median_ratio(decode, "forward_bandwidth", bw),
        num_decode_steps=len(decode), num_prefill_steps=len(prefill),
        decode_step_s=float(decode["step_s"].median()) if len(decode) else None,
        decode_floor_s=float(floor_seconds(decode, peaks).median()) if len(decode) and peaks else None,
    )
