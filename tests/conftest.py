"""Shared fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

# NOTE: the pytest plugin's own tests (tests/loadtests/pytest_plugin) run inner pytest sessions.
pytest_plugins = ["pytester"]

# NOTE: Triton decides compiled vs interpreted when a kernel is defined, so without a GPU the
# interpreter must be switched on before any test module imports engine.kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# NOTE: the test session keeps its step calibrations (probes.calibration_cache) in a directory of its own: never the
# user's (measured by other code), and the servers of one session with the same settings calibrate once.
if "SERVESCOPE_CALIBRATION_CACHE" not in os.environ:
    os.environ["SERVESCOPE_CALIBRATION_CACHE"] = tempfile.mkdtemp(prefix="servescope-calibration-")
    atexit.register(shutil.rmtree, os.environ["SERVESCOPE_CALIBRATION_CACHE"], ignore_errors=True)


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
