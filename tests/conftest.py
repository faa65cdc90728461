"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# NOTE: Triton decides compiled vs interpreted when a kernel is defined, so without a GPU the
# interpreter must be switched on before any test module imports engine.kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (downloaded once into the servescope cache)."""
    from engine.weights.fetch import fetch_smollm2

    return fetch_smollm2()
