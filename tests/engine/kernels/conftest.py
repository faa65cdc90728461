"""Kernel tests run for real: compiled on a CUDA device, else on CPU through Triton's interpreter.

NOTE: Triton picks interpreted vs compiled when a ``@triton.jit`` function is decorated, so
``TRITON_INTERPRET`` must be set before ``engine.kernels`` is first imported. This conftest is
imported before the test modules of this folder, which is early enough as long as nothing
collected earlier imports ``engine.kernels``; the check below says so loudly if something did.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if "engine.kernels" in sys.modules and not torch.cuda.is_available():
    from engine.kernels import triton_available

    if not triton_available()[0]:
        raise pytest.UsageError(
            "engine.kernels was imported before tests/engine/kernels/conftest.py set TRITON_INTERPRET=1; "
            "set it in the environment (TRITON_INTERPRET=1 pytest ...) or in tests/conftest.py"
        )


def kernel_devices() -> list[str]:
    from engine.kernels import triton_available
    from engine.kernels._checks import is_interpreted
    from engine.kernels.rmsnorm import _rms_norm_kernel

    available, reason = triton_available()
    if not available:
        raise pytest.UsageError(f"Triton kernels cannot run here: {reason}")
    return ["cpu"] if is_interpreted(_rms_norm_kernel) else ["cuda"]


@pytest.fixture(params=kernel_devices())
def device(request: pytest.FixtureRequest) -> torch.device:
    """Where the kernels run: ``cpu`` under the interpreter, ``cuda`` when compiled."""
    return torch.device(request.param)
