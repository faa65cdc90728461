"""Every kernel compiles to a Hopper (sm_90) cubin, with or without a GPU here.

The interpreter runs a kernel's Python, not Triton's compiler, so code it accepts can still
fail to compile for a GPU (loop-carried types, tile shapes, dot operands). Triton compiles
ahead of time for a named target with the ptxas it ships, so this needs no device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.kernels.sm90_compile import KERNELS, VARIANTS

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "tests.engine.kernels.sm90_compile"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", list(KERNELS))
def test_compiles_for_sm90(compiled: dict[str, dict[str, object]], name: str, variant: str) -> None:
    result = compiled[f"{name}-{variant}"]
    assert "error" not in result, result.get("error")
    assert result["cubin_bytes"] > 0
    if name == "paged_prefill":
        assert result["wgmma"], "the prefill dots should run on Hopper tensor cores"
