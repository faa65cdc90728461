"""Quantized weights in the record layout ``quant_gemv.c`` streams: tiles of 16 output rows, one record per
(tile, group of 32 inputs), as many bytes as the GGUF's own Q4_1 (20 per row and group) or Q8_0 (34).

Packed once at load; the layout is described in ``quant_gemv.c``. Scales and minimums are stored in
float16, as the GGUF stores them: a GGUF weight packs exactly, any other one is rounded once here and
:meth:`PackedWeight.dequantize` gives the weight the kernel actually multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.quant import INT4_GROUP_SIZE, Int4Groups, Int8Groups

TILE_ROWS = 16
RECORD_BYTES = {4: 320, 8: 544}


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """``[num_rows, num_cols]`` weight as ``bits``-bit codes: ``data`` is ``[tiles, groups, record]`` uint8."""

    data: torch.Tensor
    bits: int
    num_rows: int
    num_cols: int

    def __post_init__(self) -> None:
        tiles = -(-self.num_rows // TILE_ROWS)
        expected = (tiles, self.num_cols // INT4_GROUP_SIZE, RECORD_BYTES.get(self.bits, -1))
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != expected or not self.data.is_contiguous():
            raise ValueError(f"a packed {self.bits}-bit [{self.num_rows}, {self.num_cols}] weight is contiguous "
                             f"uint8 {expected}, got {self.data.dtype} {tuple(self.data.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def check_act_bits(self, act_bits: int) -> None:
        """Raise unless the kernel multiplies these codes with ``act_bits`` activations: 16, or 8 for 4-bit codes
        (quant_gemv.c's ``bits_ok``)."""
        if act_bits not in (8, 16) or (act_bits == 8 and self.bits != 4):
            raise ValueError(f"the kernel multiplies 16-bit activations, or 8-bit ones with 4-bit weights; not "
                             f"{act_bits}-bit with {self.bits}-bit")

    def dequantize(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies (float16 scales included)."""
        tiles, groups, _ = self.data.shape
        if self.bits == 4:
            gguf_bytes = _from_pair_order(self.data[..., :256], 4)  # [T, 16, G, 16]: Q4_1's bytes per row
            codes = torch.cat([gguf_bytes & 0xF, gguf_bytes >> 4], dim=-1)
            scales, mins = (_halves(self.data[..., 256 + 32 * i:288 + 32 * i]) for i in range(2))
            weight = codes.float() * scales.unsqueeze(-1) + mins.unsqueeze(-1)
        else:
            codes = _from_pair_order(self.data[..., :512].contiguous().view(torch.int8), 8)  # [T, 16, G, 32]
            weight = codes.float() * _halves(self.data[..., 512:]).unsqueeze(-1)
        return weight.reshape(tiles * TILE_ROWS, self.num_cols)[:self.num_rows]


# NOTE: the pair order of quant_gemv.c: in each 64-byte block, byte 16L + 8 * pair + 2i + e is row 4L + i's
# value 4 * block + 2 * pair + e, so that unpacklo/unpackhi leave each 32-bit lane one row's two values.
def _to_pair_order(values: torch.Tensor) -> torch.Tensor:
    """``[T, 16, G, 4 * blocks]`` (per row, values in order) -> ``[T, G, 64 * blocks]`` in pair order."""
    tiles, _, groups, width = values.shape
    laid = values.reshape(tiles, 4, 4, groups, width // 4, 2, 2)  # [T, L, i, G, block, pair, e]
    return laid.permute(0, 3, 4, 1, 5, 2, 6).reshape(tiles, groups, 16 * width)


def _from_pair_order(data: torch.Tensor, blocks: int) -> torch.Tensor:
    """Inverse of :func:`_to_pair_order`: ``[T, G, 64 * blocks]`` -> ``[T, 16, G, 4 * blocks]``."""
    tiles, groups, _ = data.shape
    laid = data.reshape(tiles, groups, blocks, 4, 2, 4, 2)  # [T, G, block, L, pair, i, e]
    return laid.permute(0, 3, 5, 1, 2, 4, 6).reshape(tiles, TILE_ROWS, groups, 4 * blocks)


def _halves(raw: torch.Tensor) -> torch.Tensor:
    """``[tiles, groups, 32]`` bytes of 16 float16 values -> ``[tiles, 16, groups]`` float32."""
    return raw.contiguous().view(torch.float16).float().permute(0, 2, 1)


def _tiled(rows: torch.Tensor) -> torch.Tensor:
    """``[N, ...]`` padded with zero rows to whole tiles: ``[tiles, 16, ...]``."""
    pad = -rows.shape[0] % TILE_ROWS
    if pad:
        rows = torch.cat([rows, rows.new_zeros((pad, *rows.shape[1:]))])
    return rows.reshape(-1, TILE_ROWS, *rows.shape[1:])


def _half_bytes(values: torch.Tensor) -> torch.Tensor:
    """``[N, groups]`` float -> ``[tiles, groups, 32]`` bytes of float16 (row r of a tile at bytes 2r, 2r + 1)."""
    return _tiled(values.half()).transpose(1, 2).contiguous().view(torch.uint8)


def pack_int4(groups: Int4Groups) -> PackedWeight:
    """Q4_1 groups in 320-byte records: each row's 16 Q4_1 code bytes in pair order, then float16 scales, mins."""
    num_rows, num_cols = groups.shape
    codes = _tiled(groups.codes).reshape(-1, TILE_ROWS, num_cols // 32, 32)  # [T, 16, G, 32]
    gguf_bytes = codes[..., :16] | (codes[..., 16:] << 4)  # byte c: code c (low), code c + 16 (high), as Q4_1
    data = torch.cat([_to_pair_order(gguf_bytes), _half_bytes(groups.scales), _half_bytes(groups.mins)], dim=-1)
    return PackedWeight(data.contiguous(), 4, num_rows, num_cols)


def pack_int8(groups: Int8Groups) -> PackedWeight:
    """Q8_0 groups in 544-byte records: each row's 32 signed codes in pair order, then float16 scales."""
    num_rows, num_cols = groups.shape
    codes = _tiled(groups.codes).reshape(-1, TILE_ROWS, num_cols // 32, 32).view(torch.uint8)
    data = torch.cat([_to_pair_order(codes), _half_bytes(groups.scales)], dim=-1)
    return PackedWeight(data.contiguous(), 8, num_rows, num_cols)
