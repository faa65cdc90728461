"""Fused SwiGLU activation: ``silu(gate) * up``.

Two entry points over one kernel: ``silu_and_mul`` takes the fused ``[T, 2 * I]`` projection
(gate half first, then up, as a merged gate_up weight produces) and ``silu_mul`` takes separate
``gate`` and ``up`` ``[T, I]`` tensors (the model's two projections). The halves of the fused
input are just strided views, so neither form copies. Rounding follows the eager model:
``silu(gate)`` is rounded to the activation dtype before the product.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import (
    FLOAT_DTYPES,
    check_launchable,
    check_power_of_two,
    check_shape,
    check_tensor,
    check_unit_last_stride,
    require,
)
from engine.kernels._interpreter import cast_rounded, emulate_bf16


@triton.jit
def _silu_mul_kernel(
    out_ptr,  # [T, I]
    gate_ptr,  # [T, I]
    up_ptr,  # [T, I]
    intermediate_size,
    stride_out, stride_gate, stride_up,
    BLOCK: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < intermediate_size
    gate = tl.load(gate_ptr + row * stride_gate + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * stride_up + cols, mask=mask, other=0.0).to(tl.float32)
    activated = cast_rounded(gate / (1.0 + tl.exp(-gate)), out_ptr.dtype.element_ty, EMULATE_BF16)
    out = cast_rounded(activated.to(tl.float32) * up, out_ptr.dtype.element_ty, EMULATE_BF16)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate`` and ``up`` ``[T, I]``; returns a new ``[T, I]`` tensor."""
    check_tensor("gate", gate, 2, FLOAT_DTYPES)
    check_tensor("up", up, 2, FLOAT_DTYPES)
    check_shape("up", up, tuple(gate.shape), "the same as gate")
    require(up.dtype == gate.dtype, f"gate and up must share a dtype, got {gate.dtype} and {up.dtype}")
    check_unit_last_stride("gate", gate)
    check_unit_last_stride("up", up)
    check_power_of_two("block", block)
    check_launchable(_silu_mul_kernel, gate=gate, up=up)
    num_rows, intermediate_size = gate.shape
    out = torch.empty((num_rows, intermediate_size), dtype=gate.dtype, device=gate.device)  # [T, I]
    if out.numel() > 0:
        grid = (num_rows, triton.cdiv(intermediate_size, block))
        _silu_mul_kernel[grid](
            out, gate, up, intermediate_size,
            out.stride(0), gate.stride(0), up.stride(0),
            BLOCK=block, EMULATE_BF16=emulate_bf16(_silu_mul_kernel, gate.dtype),
        )
    return out


def silu_and_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``silu(gate_up[:, :I]) * gate_up[:, I:]`` for ``gate_up`` ``[T, 2 * I]``; returns ``[T, I]``."""
    check_tensor("gate_up", gate_up, 2, FLOAT_DTYPES)
    require(gate_up.shape[1] % 2 == 0, f"gate_up's last dim must be even (gate then up), got {gate_up.shape[1]}")
    gate, up = gate_up.chunk(2, dim=1)  # two [T, I] views, row stride 2 * I
    return silu_mul(gate, up, block)
