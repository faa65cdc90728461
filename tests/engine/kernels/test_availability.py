"""triton_available and the launch-device check."""

from __future__ import annotations

import pytest
import torch
import triton

from engine.kernels import triton_available
from engine.kernels._checks import check_launchable
from engine.kernels._interpreter import is_interpreted
from engine.kernels.rmsnorm import _rms_norm_kernel


def test_available_here_with_a_reason() -> None:
    available, reason = triton_available()
    assert available, reason
    assert ("interpreter" in reason) == is_interpreted(_rms_norm_kernel)


def _identity(x):
    return x


def test_compiled_kernels_refuse_cpu_tensors() -> None:
    compiled = triton.JITFunction(_identity)  # compiled whatever TRITON_INTERPRET says
    with pytest.raises(ValueError, match="compiled Triton kernels need CUDA tensors"):
        check_launchable(compiled, x=torch.zeros(2))


def test_mixed_devices_are_named() -> None:
    with pytest.raises(ValueError, match=r"one device, got x=cpu, y=meta"):
        check_launchable(_rms_norm_kernel, x=torch.zeros(2), y=torch.zeros(2, device="meta"))
