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
The peaks come from :func:`measure_peaks`, run at the start of a run on the machine that served
it and saved as ``machine_peaks.json`` in the run directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

PEAKS_NAME = "machine_peaks.json"
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The bundled default model has the architecture of the dummy smollm2-shape (its random twin).
_NAMED_SHAPES = {"smollm2-135m": "smollm2-shape"}


@dataclass(slots=True)
class MachinePeaks:
    """Peak memory bandwidth and matmul throughput, measured on this machine's device."""

    device: str
    dtype: str
    bandwidth_bytes_per_s: float  # a large tensor copy: bytes read + written per second
    flops_per_s: float  # a square matmul in ``dtype``
    measured_at: float
    method: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachinePeaks:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the bandwidth roof meets the compute roof."""
        return self.flops_per_s / self.bandwidth_bytes_per_s


def measure_peaks(device: str = "auto", dtype: str = "float32", copy_mib: int | None = None,
                  matmul_n: int | None = None, repeats: int = 5) -> MachinePeaks:
    """Measure peak bandwidth (tensor copy) and FLOP/s (matmul) on ``device``; about a second on a CPU.

    Takes the best of ``repeats`` timings of each: a peak is what the machine can do, and any
    slower repeat was disturbed by something else.
    """
    import torch

    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       "cpu" if device == "auto" else device)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    is_cuda = dev.type == "cuda"
    copy_mib = copy_mib or (1024 if is_cuda else 128)
    matmul_n = matmul_n or (8192 if is_cuda else 1024)

    def timed(fn: Any) -> float:
        fn()  # NOTE: the first call pays for allocation and kernel selection
        best = float("inf")
        for _ in range(repeats):
            if is_cuda:
                torch.cuda.synchronize(dev)
            start = time.perf_counter()
            fn()
            if is_cuda:
                torch.cuda.synchronize(dev)
            best = min(best, time.perf_counter() - start)
        return best

    num_elements = copy_mib * 2**20 // 4
    src = torch.empty(num_elements, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src))
    bandwidth = 2 * src.numel() * src.element_size() / copy_s
    src = dst = torch.empty(0, device=dev)  # NOTE: frees the copy buffers before the matmul allocates
    a = torch.randn(matmul_n, matmul_n, device=dev).to(torch_dtype)
    b = torch.randn(matmul_n, matmul_n, device=dev).to(torch_dtype)
    matmul_s = timed(lambda: torch.mm(a, b))
    flops = 2 * matmul_n**3 / matmul_s
    name = torch.cuda.get_device_name(dev) if is_cuda else "cpu"
    return MachinePeaks(device=f"{dev} ({name})" if is_cuda else "cpu", dtype=dtype, bandwidth_bytes_per_s=bandwidth,
                        flops_per_s=flops, measured_at=time.time(),
                        method=f"best of {repeats}: copy of {copy_mib} MiB float32; {matmul_n}^2 matmul in {dtype}")


def write_peaks(run_dir: str | os.PathLike[str], peaks: MachinePeaks) -> Path:
    """Save ``peaks`` as the run directory's ``machine_peaks.json`` (atomically)."""
    from probes.run_dir import RunDirectory

    return RunDirectory(run_dir).write_json(PEAKS_NAME, peaks.to_dict())


def read_peaks(run_dir: str | os.PathLike[str]) -> MachinePeaks | None:
    path = Path(run_dir) / PEAKS_NAME
    if not path.is_file():
        return None
    return MachinePeaks.from_dict(json.loads(path.read_text(encoding="utf-8")))


@dataclass(slots=True)
class ModelShape:
    """What the roofline needs of a model: its parameter counts and KV footprint, in one dtype."""

    name: str
    dtype: str
    num_params: int
    num_layer_params: int  # parameters of the decoder layers (the per-token matmuls)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    kv_bytes_per_token: int

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, name: str, config: Any, dtype: str) -> ModelShape:
        """From an ``engine.model.config.LlamaConfig``."""
        embed = config.vocab_size * config.hidden_size
        head = 0 if config.tie_word_embeddings else embed
        layer_params = config.num_params - embed - head - config.hidden_size
        return cls(name=name, dtype=dtype, num_params=config.num_params, num_layer_params=layer_params,
                   vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=config.num_layers,
                   num_heads=config.num_heads, head_dim=config.head_dim,
                   kv_bytes_per_token=config.kv_bytes_per_token(_DTYPE_BYTES[dtype]))


def resolve_model_shape(model: str | None, dtype: str = "float32") -> ModelShape | None:
    """The shape of a model named as on ``--model``, without loading weights; None when it cannot be known here."""
    if model is None or dtype not in _DTYPE_BYTES:
        return None
    from engine.weights.dummy import DUMMY_CONFIGS

    dummy = _NAMED_SHAPES.get(model, model.removeprefix("dummy:") if model.startswith("dummy:") else None)
    if dummy in DUMMY_CONFIGS:
        return ModelShape.from_config(model, DUMMY_CONFIGS[dummy], dtype)
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        from engine.weights.hf_dir import config_from_hf

        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
        return ModelShape.from_config(model, config_from_hf(raw, path / "config.json"), dtype)
    return None


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
        "forward_bandwidth": bytes_moved / steps["forward_s"].to_numpy(dtype=float),
    })


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
    )
