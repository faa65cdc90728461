"""The GEMM behind every projection: plain ``F.linear``, or a weight prepacked for the CPU GEMM library.

A plain CPU ``F.linear`` hands its weight to the GEMM library in the model's row-major layout on
every call. The optimized CPU path reorders each weight once at load into oneDNN's blocked layout
(what inductor's weight freezing does, without compiling anything).

NOTE: a packed weight must give what ``F.linear`` gives: bit-identical in bfloat16, within 1e-4
in float32 (a different summation order). Each weight is checked once at load against
``F.linear`` (``_PROBE_TOLERANCE``) and left dense if it differs. README ("Optimized execution on
CPU") has the measured speed-ups per shape and row count.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

# The batch-size hint the packed layout is tuned for: the decode batch the engine runs by default.
_PACK_ROWS_HINT = 16
# How far a packed GEMM may differ from ``F.linear`` on the load-time probe before it is refused.
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


class Projection(Protocol):
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class DenseProjection:
    """``x @ weight.T`` through ``F.linear``: the eager way, and the fallback."""

    kind = "dense"

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class OneDnnPackedProjection:
    """float32 or bfloat16 on CPU: the weight in oneDNN's blocked layout."""

    kind = "onednn-packed"

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


def dense(weight: torch.Tensor) -> Projection:
    return DenseProjection(weight)


def packed_or_dense(weight: torch.Tensor) -> Projection:
    """The prepacked projection this build and CPU support for ``weight``, else the dense one.

    Each packed projection is checked against ``F.linear`` on a few rows before it is used; one
    that raises or disagrees falls back to dense, so an unsupported build costs speed, never tokens.
    """
    if weight.device.type != "cpu" or weight.dim() != 2:
        return DenseProjection(weight)
    if not torch.backends.mkldnn.is_available() or weight.dtype not in _PROBE_TOLERANCE:
        return DenseProjection(weight)
    if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return DenseProjection(weight)
    try:
        packed = OneDnnPackedProjection(weight)
        probe = torch.linspace(-1, 1, 3 * weight.shape[1], dtype=weight.dtype).reshape(3, -1)
        expected = F.linear(probe, weight)
        got = packed(probe)
        tol = _PROBE_TOLERANCE[weight.dtype]
        if got.shape == expected.shape and torch.allclose(got, expected, rtol=tol, atol=tol):
            return packed
    except RuntimeError:
        pass
    return DenseProjection(weight)
