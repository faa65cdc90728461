"""Argument checks shared by the kernel wrappers.

Every check reads only tensor metadata (shape, stride, dtype, device), never values, so a wrapper
never forces a device sync and stays legal inside CUDA-graph capture.
"""

from __future__ import annotations

import torch

from engine.kernels._interpreter import is_interpreted

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``; unlike ``assert`` it survives ``python -O``."""
    if not condition:
        raise ValueError(message)


def check_tensor(name: str, tensor: torch.Tensor, ndim: int, dtypes: tuple[torch.dtype, ...]) -> None:
    """Rank and dtype of one argument."""
    require(isinstance(tensor, torch.Tensor), f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    require(tensor.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(tensor.shape)}")
    allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
    require(tensor.dtype in dtypes, f"{name} must be one of ({allowed}), got {tensor.dtype}")


def check_shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...], meaning: str) -> None:
    require(tuple(tensor.shape) == expected,
            f"{name} must have shape {expected} ({meaning}), got {tuple(tensor.shape)}")


def check_unit_last_stride(name: str, tensor: torch.Tensor) -> None:
    # NOTE: the kernels address the last dim as base + arange(D), so it must be dense.
    require(tensor.stride(-1) == 1 or tensor.shape[-1] == 1,
            f"{name} must be contiguous in its last dim (stride 1), got strides {tensor.stride()}")


def check_head_dim(head_dim: int) -> None:
    require(head_dim >= 16 and head_dim & (head_dim - 1) == 0,
            f"head_dim must be a power of two >= 16 (tl.arange and tl.dot tiles), got {head_dim}")


def check_power_of_two(name: str, value: int, minimum: int = 1) -> None:
    require(value >= minimum and value & (value - 1) == 0,
            f"{name} must be a power of two >= {minimum}, got {value}")


def check_launchable(kernel: object, **tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and a device the kernel can run on; returns that device."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    require(all(d == first for d in devices.values()),
            "all tensors must be on one device, got " + ", ".join(f"{n}={d}" for n, d in devices.items()))
    require(is_interpreted(kernel) or first.type == "cuda",
            f"compiled Triton kernels need CUDA tensors, got {first}; to run them on CPU set "
            "TRITON_INTERPRET=1 before engine.kernels is first imported")
    return first
