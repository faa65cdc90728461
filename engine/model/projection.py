"""The GEMM behind every projection: plain ``F.linear``, or a weight prepacked for the CPU GEMM library.

A plain CPU bfloat16 ``F.linear`` re-lays-out its weight for oneDNN on every call. The optimized
CPU path reorders each bfloat16 weight once at load into oneDNN's blocked layout (what inductor's
weight freezing does, without compiling anything).

NOTE: measured on the 2-core AVX512-BF16 machine, bfloat16, per GEMM: 1536x576 at 16 rows (a
batch-16 decode step) 113 -> 73 us, 576x1536 117 -> 61 us, the 49152x576 LM head 6.9 -> 4.8 ms;
from 1 to 64 rows it was faster at every size tried, and at 300 rows (prefill) within 10%.
Outputs were bit-identical to ``F.linear``.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

# The batch-size hint the packed layout is tuned for: the decode batch the engine runs by default.
_PACK_ROWS_HINT = 16


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
    """bfloat16 on CPU: the weight in oneDNN's blocked layout."""

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
    # NOTE: float32 stays dense: MKL's packed op only takes the packed path when the row count
    # equals its hint (else it calls F.linear), and oneDNN float32 was slower than dense below 12 rows.
    if not (weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return DenseProjection(weight)
    try:
        packed = OneDnnPackedProjection(weight)
        probe = torch.linspace(-1, 1, 3 * weight.shape[1], dtype=weight.dtype).reshape(3, -1)
        expected = F.linear(probe, weight)
        if packed(probe).shape == expected.shape and torch.allclose(packed(probe), expected, rtol=1e-2, atol=1e-2):
            return packed
    except RuntimeError:
        pass
    return DenseProjection(weight)
