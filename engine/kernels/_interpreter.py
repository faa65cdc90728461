"""What the kernels do differently under Triton's CPU interpreter (``TRITON_INTERPRET=1``).

Triton 3.9's interpreter keeps bfloat16 as raw uint16 in numpy, which breaks two things that
are fine on a GPU: arithmetic and ``tl.dot`` on bfloat16 operands (they run as integer math),
and float32 -> bfloat16 casts (they truncate instead of rounding to nearest even). Kernels
take an ``EMULATE_BF16`` constexpr, true only under the interpreter with bfloat16 tensors; it
upcasts dot operands and rounds in software, so CPU tests check the GPU's rounding. On a GPU
it is false and the kernels use native bfloat16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def is_interpreted(kernel: object) -> bool:
    """Whether ``kernel`` was built by the interpreter (``TRITON_INTERPRET=1`` when decorated)."""
    return not isinstance(kernel, triton.JITFunction)


def emulate_bf16(kernel: object, dtype: torch.dtype) -> bool:
    """The value of a kernel's ``EMULATE_BF16`` constexpr for tensors of ``dtype``."""
    return dtype == torch.bfloat16 and is_interpreted(kernel)


@triton.jit
def cast_rounded(x, dtype: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """float32 ``x`` cast to ``dtype``, rounding to nearest even as the GPU's cvt does."""
    if EMULATE_BF16:
        # NOTE: round the float32 bits to the nearest-even 16-bit prefix (NaN aside); the
        # interpreter's truncating cast is then exact.
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)
