"""The kernels a model is built with: plain torch, or Triton (paged attention, KV store, fused norms, SiLU).

Chosen once when the model is built (``ModelOps``), so ``forward`` never asks which it has. The
torch versions are the eager reference; the Triton ones (engine/kernels/rmsnorm.py, silu_mul.py)
round step for step as these do, so both give the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention import TORCH_BACKEND, AttentionBackend


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / rms(x)`` over the last dim; computed in float32 whatever the dtype, as HF does."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = residual + x`` (rounded to the dtype), then its norm: ``(normed, residual)``."""
    summed = residual + x
    return rms_norm(summed, weight, eps), summed


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of the fused ``[T, 2 * I]`` gate/up projection (gate first)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True, slots=True)
class ModelOps:
    """The kernels every layer calls: KV store and attention, norms, activation."""

    name: str
    attention: AttentionBackend
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]


TORCH_OPS = ModelOps("torch", TORCH_BACKEND, rms_norm, add_rms_norm, silu_and_mul)


def triton_ops() -> ModelOps:
    """The fused Triton kernels (imported here: Triton picks compiled vs interpreted at import)."""
    from engine.kernels import fused_add_rms_norm
    from engine.kernels import rms_norm as triton_rms_norm
    from engine.kernels import silu_and_mul as triton_silu_and_mul
    from engine.kernels.backend import TritonAttentionBackend

    return ModelOps("triton", TritonAttentionBackend(), triton_rms_norm, fused_add_rms_norm, triton_silu_and_mul)
