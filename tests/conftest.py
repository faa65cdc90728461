"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (downloaded once into the servescope cache)."""
    from engine.weights.fetch import fetch_smollm2

    return fetch_smollm2()
