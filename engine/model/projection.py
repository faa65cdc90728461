"""The GEMM behind every projection: plain ``F.linear``, a weight prepacked for the CPU GEMM library,
or a weight-only int8 or int4 weight.

A plain CPU ``F.linear`` hands its weight to the GEMM library in the model's row-major layout on
every call. The optimized CPU path reorders each weight once at load into oneDNN's blocked layout
(what inductor's weight freezing does, without compiling anything). The quantized projections
keep only their codes and scales, and dequantize inside torch's CPU kernels
(``_weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``): a decode step reads 4x (int8) or
about 7x (int4) fewer weight bytes than float32.

NOTE: a projection owns the only copy of its weight the model keeps: once built, the dense
tensor it came from can be freed.

NOTE: a packed weight must give what ``F.linear`` gives: bit-identical in bfloat16, within 1e-4
in float32 (a different summation order). Each weight is checked once at load against
``F.linear`` (``_PROBE_TOLERANCE``) and left dense if it differs. docs/results.md ("The
engine") has the measured speed-ups per shape and row count.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch
import torch.nn.functional as F

from engine.model.quant import INT4_GROUP_SIZE, Int4Groups, int8_rows

ProjectionKind = Literal["dense", "packed", "int8", "int4"]

# The batch-size hint the packed layout is tuned for: the decode batch the engine runs by default.
_PACK_ROWS_HINT = 16
# How far a packed GEMM may differ from ``F.linear`` on the load-time probe before it is refused.
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def native_bf16_gemm() -> str | None:
    """The instructions this CPU runs bfloat16 GEMMs on natively ("AMX", "AVX512-BF16"), or None.

    Detected, not assumed: without them oneDNN emulates bfloat16 and ``--dtype bfloat16`` loses its speed.
    """
    if not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    return "AVX512-BF16" if torch.cpu._is_avx512_bf16_supported() else None


class Projection(Protocol):
    kind: str
    weight_bytes: int  # what one matmul reads of the weight (a decode step's read): codes, scales and all

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class DenseProjection:
    """``x @ weight.T`` through ``F.linear``: the eager way, and the fallback."""

    kind = "dense"

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.weight_bytes = weight.nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class OneDnnPackedProjection:
    """float32 or bfloat16 on CPU: the weight in oneDNN's blocked layout."""

    kind = "onednn-packed"

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT)
        self.weight_bytes = weight.nbytes  # the blocked layout holds the same elements

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


class Int8Projection:
    """Weight-only int8: one symmetric scale per output row; activations stay in their dtype."""

    kind = "int8"

    def __init__(self, weight: torch.Tensor) -> None:
        codes, scales = int8_rows(weight)
        self.codes = codes  # [N, K] int8
        self.scales = scales.to(weight.dtype)  # [N]; the kernel wants the activations' dtype
        self.weight_bytes = self.codes.nbytes + self.scales.nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales)


class Int4Projection:
    """Weight-only int4 in groups of 32 along the input (GGUF Q4_1's groups), packed for torch's CPU kernel."""

    kind = "int4"
    _INNER_K_TILES = 2

    def __init__(self, groups: Int4Groups, dtype: torch.dtype) -> None:
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.codes.to(torch.int32),
                                                                         self._INNER_K_TILES)
        # NOTE: the kernel computes (code - 8) * scale + zero, so Q4_1's min becomes zero = min + 8 * scale.
        zeros = groups.mins + 8 * groups.scales
        self.scales_and_zeros = torch.stack([groups.scales, zeros], dim=-1).transpose(0, 1).contiguous().to(dtype)
        self.weight_bytes = self.packed.nbytes + self.scales_and_zeros.nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, INT4_GROUP_SIZE, self.scales_and_zeros)


def dense(weight: torch.Tensor) -> Projection:
    return DenseProjection(weight)


def quantized_projection(kind: Literal["int8", "int4"], weight: torch.Tensor,
                         groups: Int4Groups | None = None) -> Projection:
    """An int8 or int4 projection of ``weight`` (CPU only); int4 uses ``groups`` when the file had them."""
    if weight.device.type != "cpu":
        raise ValueError(f"weights={kind} runs on torch's CPU kernels; this model is on {weight.device}")
    if kind == "int8":
        return Int8Projection(weight)
    return Int4Projection(groups if groups is not None else Int4Groups.from_float(weight), weight.dtype)


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
