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
# NOTE: every test (and every server it starts) calibrates its steps anew: a cached calibration from another test,
# or from the user's own runs, would stand in for the code under test.
os.environ.setdefault("SERVESCOPE_CALIBRATION_CACHE", "off")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (downloaded once into the servescope cache)."""
    from engine.weights.fetch import fetch_smollm2

    return fetch_smollm2()


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf: Path):
    """HF transformers' own load of the same GGUF: the independent oracle (loaded once per session)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def smollm2_loaded(smollm2_gguf: Path):
    """Our loader's result for the real weights, shared by every real-model test."""
    from engine.weights import load_model

    return load_model("smollm2-135m")
