"""Triton kernels for the optimized execution path, each with a plain-torch reference.

Kernels run on a CUDA device, or on CPU through Triton's interpreter when ``TRITON_INTERPRET=1``
is set before this package is first imported (Triton picks compiled vs interpreted per kernel
at decoration time). ``engine.kernels.reference`` holds the reference of each.
"""

from __future__ import annotations

import torch
import triton

from engine.kernels._interpreter import is_interpreted
from engine.kernels.kv_store import store_kv
from engine.kernels.paged_decode import paged_decode_attention
from engine.kernels.paged_prefill import paged_prefill_attention
from engine.kernels.rmsnorm import _rms_norm_kernel, fused_add_rms_norm, rms_norm
from engine.kernels.silu_mul import silu_and_mul, silu_mul

__all__ = [
    "fused_add_rms_norm",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "silu_and_mul",
    "silu_mul",
    "store_kv",
    "triton_available",
]


def triton_available() -> tuple[bool, str]:
    """Whether these kernels can run here, and why (or why not)."""
    if is_interpreted(_rms_norm_kernel):
        return True, "Triton interpreter (TRITON_INTERPRET=1): kernels run on CPU, slowly"
    if triton.knobs.runtime.interpret:
        return False, ("TRITON_INTERPRET was set after engine.kernels was imported; set it before the first "
                       "import so the kernels are built for the interpreter")
    if not torch.cuda.is_available():
        return False, "no CUDA device (and TRITON_INTERPRET=1 is not set)"
    return True, f"CUDA device {torch.cuda.get_device_name()}"
