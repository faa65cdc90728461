"""silu_mul and silu_and_mul against the model's SwiGLU activation."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import silu_and_mul, silu_mul
from engine.kernels.reference import silu_and_mul_reference, silu_mul_reference
from tests.engine.kernels.paged_cases import random_tensor

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("block", [16, 1024])  # 16: several column tiles, the last one masked
def test_silu_and_mul_matches_reference(device: torch.device, dtype: torch.dtype, block: int) -> None:
    gate_up = 3 * random_tensor((6, 2 * 40), dtype, device, 0)  # [T, 2 * I], I = 40
    out = silu_and_mul(gate_up, block=block)
    assert out.shape == (6, 40) and out.dtype == dtype
    torch.testing.assert_close(out.cpu(), silu_and_mul_reference(gate_up.cpu()))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_silu_mul_separate_halves(device: torch.device, dtype: torch.dtype) -> None:
    gate = 3 * random_tensor((5, 24), dtype, device, 1)
    up = random_tensor((5, 32), dtype, device, 2)[:, :24]  # a strided view
    out = silu_mul(gate, up, block=16)
    torch.testing.assert_close(out.cpu(), silu_mul_reference(gate.cpu(), up.cpu()))


def test_bad_inputs_raise(device: torch.device) -> None:
    with pytest.raises(ValueError, match="must be even"):
        silu_and_mul(torch.zeros(2, 7, device=device))
    with pytest.raises(ValueError, match="up must have shape"):
        silu_mul(torch.zeros(2, 4, device=device), torch.zeros(2, 5, device=device))
    with pytest.raises(ValueError, match="must share a dtype"):
        silu_mul(torch.zeros(2, 4, device=device), torch.zeros(2, 4, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="gate_up must have 2 dims"):
        silu_and_mul(torch.zeros(8, device=device))
    with pytest.raises(ValueError, match="block must be a power of two"):
        silu_mul(torch.zeros(2, 4, device=device), torch.zeros(2, 4, device=device), block=100)
