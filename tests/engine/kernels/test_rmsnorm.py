"""rms_norm and fused_add_rms_norm against the model's RMSNorm module."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import fused_add_rms_norm, rms_norm
from engine.kernels.reference import fused_add_rms_norm_reference, rms_norm_reference
from tests.engine.kernels.paged_cases import random_tensor

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("hidden_size", [48, 64])  # 48: the row is not a power of two, so masked
def test_rms_norm_matches_reference(device: torch.device, dtype: torch.dtype, hidden_size: int) -> None:
    wide = random_tensor((7, hidden_size + 8), dtype, device, 0)
    x = wide[:, :hidden_size]  # [T, hidden], row stride hidden + 8
    weight = (1 + 0.1 * random_tensor((hidden_size,), torch.float32, device, 1)).to(dtype)
    out = rms_norm(x, weight, EPS)
    expected = rms_norm_reference(x.cpu(), weight.cpu(), EPS)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_fused_add_rms_norm_matches_reference(device: torch.device, dtype: torch.dtype) -> None:
    x = random_tensor((5, 48), dtype, device, 2)
    residual = random_tensor((5, 48), dtype, device, 3)
    weight = (1 + 0.1 * random_tensor((48,), torch.float32, device, 4)).to(dtype)
    x_before, residual_before = x.clone(), residual.clone()
    out, new_residual = fused_add_rms_norm(x, residual, weight, EPS)
    expected_out, expected_residual = fused_add_rms_norm_reference(x.cpu(), residual.cpu(), weight.cpu(), EPS)
    # The residual sum is one rounding of an exact fp32 add, in both: bit-equal.
    assert torch.equal(new_residual.cpu(), expected_residual)
    torch.testing.assert_close(out.cpu(), expected_out)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before), "inputs must stay untouched"


@pytest.mark.parametrize(("args", "message"), [
    ((torch.zeros(2, 3, 8), torch.ones(8)), "x must have 2 dims"),
    ((torch.zeros(2, 8), torch.ones(6)), r"weight must have shape \(8,\)"),
    ((torch.zeros(2, 8), torch.ones(8, dtype=torch.float16)), "weight dtype"),
    ((torch.zeros(2, 8, dtype=torch.int64), torch.ones(8)), "x must be one of"),
    ((torch.zeros(8, 2).t(), torch.ones(8)), "contiguous in its last dim"),
])
def test_bad_inputs_raise(device: torch.device, args: tuple[torch.Tensor, torch.Tensor], message: str) -> None:
    x, weight = (t.to(device) for t in args)
    with pytest.raises(ValueError, match=message):
        rms_norm(x, weight, EPS)


def test_bad_residual_raises(device: torch.device) -> None:
    x, weight = torch.zeros(2, 8, device=device), torch.ones(8, device=device)
    with pytest.raises(ValueError, match="residual must have shape"):
        fused_add_rms_norm(x, torch.zeros(3, 8, device=device), weight, EPS)
    with pytest.raises(ValueError, match="residual dtype"):
        fused_add_rms_norm(x, torch.zeros(2, 8, dtype=torch.bfloat16, device=device), weight, EPS)
