"""Weight-only quantized forms of a GEMM weight: int4 and int8 groups (as GGUF's Q4_1 and Q8_0 store them)
and int8 rows.

``Int4Groups`` is a ``[N, K]`` weight as 4-bit codes in groups of 32 along K, each group with its
own scale and minimum: ``w = scale * code + min``, the Q4_1 layout. ``Int8Groups`` is the Q8_0 layout:
signed 8-bit codes and one scale per group of 32, ``w = scale * code``. A GGUF tensor of either type
gives these exactly (``engine.weights.gguf_quant``); any other weight is quantized to them by each
group's range. ``int8_rows`` requantizes a dense weight to one symmetric int8 scale per output row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP_SIZE = 32


def _groups_fit(codes: torch.Tensor, *per_group: torch.Tensor) -> bool:
    """``codes`` ``[N, K]`` with K a whole number of groups, and each of ``per_group`` ``[N, K / 32]``."""
    num_rows, num_cols = codes.shape
    groups = (num_rows, num_cols // INT4_GROUP_SIZE)
    return not num_cols % INT4_GROUP_SIZE and all(tuple(t.shape) == groups for t in per_group)


def _by_group(t: torch.Tensor) -> torch.Tensor:
    """A ``[N, K]`` tensor as float32 ``[N, K / 32, 32]``: one row per group."""
    return t.float().view(t.shape[0], -1, INT4_GROUP_SIZE)


def _nonzero(scales: torch.Tensor) -> torch.Tensor:
    """The scales to divide by: a zero scale (all values of the group equal) divides by 1 instead."""
    return torch.where(scales > 0, scales, torch.ones_like(scales))


@dataclass(frozen=True, slots=True)
class Int4Groups:
    """``w[n, k] = scales[n, k // 32] * codes[n, k] + mins[n, k // 32]``; codes in 0..15."""

    codes: torch.Tensor  # [N, K] uint8
    scales: torch.Tensor  # [N, K / 32] float32
    mins: torch.Tensor  # [N, K / 32] float32

    def __post_init__(self) -> None:
        if not _groups_fit(self.codes, self.scales, self.mins):
            raise ValueError(f"int4 groups of {INT4_GROUP_SIZE} do not fit codes {tuple(self.codes.shape)}, "
                             f"scales {tuple(self.scales.shape)}, mins {tuple(self.mins.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[N, K]`` weight these codes stand for."""
        return (_by_group(self.codes) * self.scales.unsqueeze(-1) + self.mins.unsqueeze(-1)).view(self.shape)

    def permute_rows(self, order: torch.Tensor) -> Int4Groups:
        return Int4Groups(self.codes[order], self.scales[order], self.mins[order])

    @staticmethod
    def cat(parts: list[Int4Groups]) -> Int4Groups:
        """Groups of weights stacked along the output rows (fused QKV, gate/up)."""
        return Int4Groups(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                          torch.cat([p.mins for p in parts]))

    @staticmethod
    def from_float(weight: torch.Tensor) -> Int4Groups:
        """Quantize by each group's range: its min maps to code 0 and its max to 15 (Q4_1's rule)."""
        num_rows, num_cols = weight.shape
        if num_cols % INT4_GROUP_SIZE:
            raise ValueError(f"int4 needs the input size to be a multiple of {INT4_GROUP_SIZE}, got {num_cols}")
        grouped = _by_group(weight)
        low, high = grouped.amin(-1), grouped.amax(-1)
        scales = (high - low) / 15
        codes = ((grouped - low.unsqueeze(-1)) / _nonzero(scales).unsqueeze(-1)).round().clamp_(0, 15)
        return Int4Groups(codes.to(torch.uint8).view(num_rows, num_cols), scales, low)


@dataclass(frozen=True, slots=True)
class Int8Groups:
    """``w[n, k] = scales[n, k // 32] * codes[n, k]``; codes in -127..127 (Q8_0)."""

    codes: torch.Tensor  # [N, K] int8
    scales: torch.Tensor  # [N, K / 32] float32

    def __post_init__(self) -> None:
        if not _groups_fit(self.codes, self.scales):
            raise ValueError(f"int8 groups of {INT4_GROUP_SIZE} do not fit codes {tuple(self.codes.shape)}, "
                             f"scales {tuple(self.scales.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[N, K]`` weight these codes stand for."""
        return (_by_group(self.codes) * self.scales.unsqueeze(-1)).view(self.shape)

    @staticmethod
    def from_float(weight: torch.Tensor) -> Int8Groups:
        """Quantize symmetrically by each group's largest magnitude (Q8_0's rule, float16 scales)."""
        num_rows, num_cols = weight.shape
        if num_cols % INT4_GROUP_SIZE:
            raise ValueError(f"int8 groups need the input size to be a multiple of {INT4_GROUP_SIZE}, got {num_cols}")
        grouped = _by_group(weight)
        scales = (grouped.abs().amax(-1) / 127).half().float()
        codes = (grouped / _nonzero(scales).unsqueeze(-1)).round().clamp_(-127, 127)
        return Int8Groups(codes.to(torch.int8).view(num_rows, num_cols), scales)


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes int8 [N, K], scales float32 [N])`` with ``w ~= codes * scales[:, None]``, symmetric per row."""
    w = weight.float()
    scales = w.abs().amax(dim=1) / 127
    codes = (w / _nonzero(scales).unsqueeze(1)).round().clamp_(-127, 127).to(torch.int8)
    return codes, scales
