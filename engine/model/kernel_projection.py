"""A projection whose weight is 4-bit (Q4_1) or 8-bit (Q8_0) codes multiplied by the CPU's C kernel.

Decode steps have few rows: reading the weight is the whole cost, and the kernel reads the codes
once per step (``engine/cpu_kernels/quant_gemv.c``). A step with many rows (a prompt chunk) is a
real GEMM; where the CPU's dense GEMM beats the kernel from some row count on (``dense_from_rows``),
those steps go to a dense copy of the same weight instead, at the cost of its memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.model.projection import Projection

if TYPE_CHECKING:
    from engine.cpu_kernels import CpuKernels
    from engine.cpu_kernels.quant_pack import PackedWeight


# From about this many rows on, a step's bfloat16 GEMMs over a dense copy (oneDNN, AVX-512 BF16) beat the
# kernel on SmolLM2-135M's projections: `python -m studies.quant_gemm` on a 2-core AMD EPYC (AVX-512 VNNI and
# BF16), docs/results.md. Below it the kernel is faster; float32 dense GEMMs never are.
BF16_DENSE_FROM_ROWS = 32


class KernelQuantProjection:
    """``x @ w.T`` over packed codes, or over ``dense`` for steps of ``dense_from_rows`` rows or more; the kernel
    quantizes the activations to ``act_bits`` (8 only for 4-bit codes)."""

    def __init__(self, kernels: CpuKernels, packed: PackedWeight, dense: Projection | None = None,
                 dense_from_rows: int | None = None, act_bits: int = 16) -> None:
        if (dense is None) != (dense_from_rows is None):
            raise ValueError("a dense copy and the row count from which it is used go together")
        packed.check_act_bits(act_bits)  # at load, not at the first step
        self.kind = f"int{packed.bits}-kernel" + ("-a8" if act_bits == 8 else "")
        self.act_bits = act_bits
        self.packed = packed
        self.weight_bytes = packed.nbytes  # a decode step's read; the dense copy serves big steps only
        self.dense = dense
        # NOTE: with no dense copy every step takes the kernel; a bound above any batch keeps __call__ one test.
        self.dense_from_rows = dense_from_rows if dense_from_rows is not None else 1 << 62
        self._gemm = kernels.quant_gemm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= self.dense_from_rows:
            return self.dense(x)  # type: ignore[misc]
        return self._gemm(x, self.packed, act_bits=self.act_bits)
