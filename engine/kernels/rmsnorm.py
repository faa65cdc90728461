"""RMSNorm, optionally fused with the residual add that precedes it.

Rounding follows the model's eager ``RMSNorm`` (engine/model/llama.py) step for step: the
residual sum is rounded to the activation dtype, the norm is computed in float32 from that
rounded sum, the normalized row is rounded, then scaled by the weight. One program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import (
    FLOAT_DTYPES,
    check_launchable,
    check_shape,
    check_tensor,
    check_unit_last_stride,
    require,
)
from engine.kernels._interpreter import cast_rounded, emulate_bf16


@triton.jit
def _rms_norm_kernel(
    out_ptr,  # [T, hidden]
    residual_out_ptr,  # [T, hidden], unused unless HAS_RESIDUAL
    x_ptr,  # [T, hidden]
    residual_ptr,  # [T, hidden], unused unless HAS_RESIDUAL
    weight_ptr,  # [hidden]
    hidden_size,
    eps,
    stride_out, stride_residual_out, stride_x, stride_residual,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        summed = cast_rounded(x + residual, residual_out_ptr.dtype.element_ty, EMULATE_BF16)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, summed, mask=mask)
        # NOTE: normalize the rounded sum, as the eager model normalizes the stored residual.
        x = summed.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / hidden_size
    normed = cast_rounded(x * tl.rsqrt(mean_square + eps), out_ptr.dtype.element_ty, EMULATE_BF16)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = cast_rounded(normed.to(tl.float32) * weight, out_ptr.dtype.element_ty, EMULATE_BF16)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def _check_args(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("weight", weight, 1, FLOAT_DTYPES)
    check_shape("weight", weight, (x.shape[1],), "hidden_size")
    require(weight.dtype == x.dtype, f"weight dtype {weight.dtype} must match x dtype {x.dtype}")
    check_unit_last_stride("x", x)
    require(weight.is_contiguous(), "weight must be contiguous")
    tensors = {"x": x, "weight": weight}
    if residual is not None:
        check_tensor("residual", residual, 2, FLOAT_DTYPES)
        check_shape("residual", residual, tuple(x.shape), "the same as x")
        require(residual.dtype == x.dtype, f"residual dtype {residual.dtype} must match x dtype {x.dtype}")
        check_unit_last_stride("residual", residual)
        tensors["residual"] = residual
    check_launchable(_rms_norm_kernel, **tensors)


def _launch(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    _check_args(x, weight, residual)
    num_rows, hidden_size = x.shape
    out = torch.empty((num_rows, hidden_size), dtype=x.dtype, device=x.device)  # [T, hidden]
    residual_out = None if residual is None else torch.empty_like(out)
    if num_rows > 0:
        # NOTE: with no residual the kernel never touches its residual pointers; x stands in.
        res_in = x if residual is None else residual
        res_out = out if residual_out is None else residual_out
        _rms_norm_kernel[(num_rows,)](
            out, res_out, x, res_in, weight,
            hidden_size, eps,
            out.stride(0), res_out.stride(0), x.stride(0), res_in.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden_size),
            EMULATE_BF16=emulate_bf16(_rms_norm_kernel, x.dtype),
        )
    return out, residual_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / rms(x))`` over the last dim of ``x`` ``[T, hidden]``, accumulated in float32."""
    out, _ = _launch(x, weight, eps, None)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = x + residual; out = rms_norm(residual)``; returns ``(out, residual)``.

    Out of place (new tensors, inputs untouched), unlike vLLM's in-place op of the same name.
    """
    out, residual_out = _launch(x, weight, eps, residual)
    assert residual_out is not None
    return out, residual_out
