"""The codes of GGUF Q4_1 and Q8_0 tensors, read as stored (no dequantize-requantize round trip).

A Q4_1 block holds 32 consecutive values of a row: ``d`` (float16), ``m`` (float16) and 16 bytes
of codes, value ``j`` in the low nibble of byte ``j`` and value ``j + 16`` in its high nibble;
``w = d * code + m``. That is :class:`~engine.model.quant.Int4Groups` exactly. A Q8_0 block holds
``d`` (float16) and 32 signed bytes, ``w = d * code``: :class:`~engine.model.quant.Int8Groups`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.model.quant import INT4_GROUP_SIZE, Int4Groups, Int8Groups

_Q4_1_BLOCK_BYTES = 20
_Q8_0_BLOCK_BYTES = 34


def _blocks(raw: np.ndarray, shape: tuple[int, int], type_name: str, block_bytes: int) -> np.ndarray:
    """A tensor's raw bytes as one row of ``block_bytes`` per block of 32 values, checked against ``shape``."""
    num_rows, num_cols = shape
    if num_cols % INT4_GROUP_SIZE:
        raise ValueError(f"a {type_name} row of {num_cols} values is not a whole number of {INT4_GROUP_SIZE}-value "
                         f"blocks")
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, block_bytes)
    if blocks.shape[0] != num_rows * num_cols // INT4_GROUP_SIZE:
        raise ValueError(f"{type_name} data holds {blocks.shape[0]} blocks, shape {shape} needs "
                         f"{num_rows * num_cols // INT4_GROUP_SIZE}")
    return blocks


def _float16_field(blocks: np.ndarray, start: int, num_rows: int) -> np.ndarray:
    """Each block's float16 at byte ``start``, as float32 ``[rows, blocks per row]``."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32).reshape(num_rows, -1)


def q4_1_groups(raw: np.ndarray, shape: tuple[int, int]) -> Int4Groups:
    """``Int4Groups`` of a Q4_1 tensor's raw bytes, for a ``[rows, cols]`` (torch order) weight."""
    num_rows, num_cols = shape
    blocks = _blocks(raw, shape, "Q4_1", _Q4_1_BLOCK_BYTES)
    scales, mins = _float16_field(blocks, 0, num_rows), _float16_field(blocks, 2, num_rows)
    packed = blocks[:, 4:]
    codes = np.concatenate([packed & 0xF, packed >> 4], axis=1).reshape(num_rows, num_cols)
    return Int4Groups(torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(mins))


def q8_0_groups(raw: np.ndarray, shape: tuple[int, int]) -> Int8Groups:
    """``Int8Groups`` of a Q8_0 tensor's raw bytes, for a ``[rows, cols]`` (torch order) weight."""
    num_rows, num_cols = shape
    blocks = _blocks(raw, shape, "Q8_0", _Q8_0_BLOCK_BYTES)
    scales = _float16_field(blocks, 0, num_rows)
    codes = blocks[:, 2:].copy().view(np.int8).reshape(num_rows, num_cols)
    return Int8Groups(torch.from_numpy(codes), torch.from_numpy(scales))


@dataclass(frozen=True, slots=True)
class Q8_0Tensor:
    """A Q8_0 weight of the file (SmolLM2's token embedding, also its LM head), decoded on request."""

    raw: np.ndarray
    shape: tuple[int, int]

    def groups(self) -> Int8Groups:
        return q8_0_groups(self.raw, self.shape)


@dataclass(frozen=True, slots=True)
class Q4_1Tensor:
    """A Q4_1 weight of the file, decoded to :class:`Int4Groups` only when a model asks for int4.

    ``row_order`` is set for q/k projections, whose rows the loader un-permutes from llama.cpp's
    interleaved rotary layout (the codes get the same row order as the dequantized weight).
    """

    raw: np.ndarray  # the file's bytes (a view of the memory map)
    shape: tuple[int, int]
    row_order: torch.Tensor | None = None  # [rows] int64: output row i is the file's row row_order[i]

    def groups(self) -> Int4Groups:
        groups = q4_1_groups(self.raw, self.shape)
        return groups if self.row_order is None else groups.permute_rows(self.row_order)
