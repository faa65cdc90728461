"""Every other way the bundled engine can run the served model on this device: the execution levers.

A run's steps show the cost of the one way it ran. The other ways (the optimized path for an eager
run, a lower-precision dtype the device computes natively, weight-only int8/int4, the other
attention backend) are each an :class:`ExecutionVariant`: a few engine settings changed from the
run's. The step calibration (:mod:`probes.step_calibration`) times every variant this module names
for a run on the run's own weights before the load, and the predictions replay each one.

Only what the device runs natively is offered: bfloat16 on a CPU only with AVX512-BF16 or AMX (else
oneDNN emulates it and it is slower), int8/int4 weights only on a CPU (the engine has no GPU path for
them) and only with bfloat16 activations (with float32 ones torch takes a slow path), except int4 on
the C kernel, which multiplies float32 activations as fast (offered with them where bfloat16 would be
emulated and the kernels build); on a CPU whose kernels are the AVX2 build, int4 with 8-bit activations
(``--int4-act-bits 8``: faster from a few rows on, less accurate); float16 only on a GPU. A variant the
device would emulate is never timed, so it costs the calibration nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# The config fields whose change changes the numbers the model computes (its price is measured too).
NUMERIC_FIELDS = frozenset({"dtype", "weights", "int4_act_bits"})
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
CPU_KERNEL_DTYPES = ("float32", "bfloat16")  # what the C decode-attention kernel has
WEIGHT_BITS = {"dense": 16, "int8": 8, "int4": 4}  # dense: whatever the dtype, more than int8


@dataclass(frozen=True, slots=True)
class ExecutionVariant:
    """The run's settings with ``changes`` applied: one execution lever."""

    changes: Mapping[str, str | int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Its key in ``step_calibration.json``: the execution paths keep their names (``eager``, ``optimized``),
        the others read as their changes (``dtype=bfloat16,weights=int4``)."""
        if set(self.changes) == {"execution"}:
            return str(self.changes["execution"])
        return ",".join(f"{k}={v}" for k, v in sorted(self.changes.items()))

    @property
    def flags(self) -> str:
        return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self.changes.items())

    @property
    def changes_numbers(self) -> bool:
        """Whether the model computes different numbers with it (a dtype, quantized weights)."""
        return bool(NUMERIC_FIELDS & set(self.changes))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "changes": dict(self.changes), "flags": self.flags,
                "changes_numbers": self.changes_numbers}


def native_dtypes(device: torch.device) -> tuple[str, ...]:
    """The dtypes ``device`` computes GEMMs in natively (float32 always)."""
    if device.type == "cuda":
        bf16 = ("bfloat16",) if torch.cuda.is_bf16_supported() else ()
        return ("float32", "float16", *bf16)
    from engine.model.projection import native_bf16_gemm

    return ("float32", "bfloat16") if native_bf16_gemm() is not None else ("float32",)


def c_kernels_isa() -> str | None:
    """The instruction set the CPU's C kernels (the int4 GEMM among them) were built with here ("avx512-vnni",
    "avx2" or "scalar"); None where they cannot build (cached after the first call)."""
    from engine.cpu_kernels import cpu_kernels

    kernels, _ = cpu_kernels()
    return None if kernels is None else kernels.isa


def resolved_attention_backend(config: Any, device: torch.device) -> str:
    """The attention backend ``auto`` picks (as the model runner does)."""
    if config.attention_backend != "auto":
        return str(config.attention_backend)
    if config.execution != "optimized":
        return "torch"
    return "triton" if device.type == "cuda" else "cpu"


def execution_variants(config: Any, device: torch.device) -> list[ExecutionVariant]:
    """The execution levers for a run with engine ``config`` on ``device``, the run's own way left out."""
    out: list[ExecutionVariant] = []
    if config.execution == "eager":
        out.append(ExecutionVariant({"execution": "optimized"}))
    dtypes = native_dtypes(device)
    # NOTE: only a smaller dtype: a wider one computes more bytes per weight on every device here.
    out += [ExecutionVariant({"dtype": d}) for d in dtypes if ITEMSIZE[d] < ITEMSIZE[str(config.dtype)]]
    if device.type == "cpu":
        activations = str(config.dtype) if config.dtype != "float32" else "bfloat16" if "bfloat16" in dtypes else None
        int4: dict[str, str] | None = None  # what makes this run int4 (None: no int4 lever here)
        isa = c_kernels_isa()
        if activations is not None:
            extra = {"dtype": activations} if activations != config.dtype else {}
            out += [ExecutionVariant({**extra, "weights": w}) for w in ("int8", "int4")
                    if WEIGHT_BITS[w] < WEIGHT_BITS[str(config.weights)]]
            int4 = {} if config.weights == "int4" else {**extra, "weights": "int4"}
        elif isa is not None:
            # NOTE: a float32 run where bfloat16 is emulated: int4 on the C kernel with its own float32
            # activations (a one-row step of SmolLM2-135M 37 -> 5 ms on a 2-core AVX2 EPYC, docs/results.md)
            int4 = {} if config.weights == "int4" else {"weights": "int4"}
            if int4:
                out.append(ExecutionVariant(int4))
        # NOTE: only where the kernels are the AVX2 build: 8-bit activations halve its instructions (30 layers at
        # 8 rows 14.6 -> 9.0 ms, docs/results.md); an AVX-512 VNNI build runs the 8-bit tile as AVX2 code, which
        # is unmeasured against its own 16-bit tile
        if int4 is not None and isa == "avx2" and config.int4_act_bits != 8:
            out.append(ExecutionVariant({**int4, "int4_act_bits": 8}))
    backend = resolved_attention_backend(config, device)
    other = {"cpu": "torch", "triton": "torch", "torch": "cpu" if device.type == "cpu" else "triton"}[backend]
    if not (other == "cpu" and config.dtype not in CPU_KERNEL_DTYPES):
        out.append(ExecutionVariant({"attention_backend": other}))
    return out
