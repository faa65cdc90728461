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

    def dequantize(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies (float16 scales included)."""
        tiles, groups, _ = self.data.shape
        if self.bits == 4:
            nibbles = self.data[..., :256].reshape(tiles, groups, 4, TILE_ROWS, 4)
            low, high = (nibbles & 0xF), (nibbles >> 4)
            codes = torch.cat([low, high], dim=2).permute(0, 3, 1, 2, 4).reshape(tiles, TILE_ROWS, groups, 32)
            scales, mins = (_halves(self.data[..., 256 + 32 * i:288 + 32 * i]) for i in range(2))
            weight = codes.float() * scales.unsqueeze(-1) + mins.unsqueeze(-1)
        else:
            codes = self.data[..., :512].reshape(tiles, groups, 8, TILE_ROWS, 4).permute(0, 3, 1, 2, 4)
            codes = codes.reshape(tiles, TILE_ROWS, groups, 32).int() - 128
            weight = codes.float() * _halves(self.data[..., 512:]).unsqueeze(-1)
        return weight.reshape(tiles * TILE_ROWS, self.num_cols)[:self.num_rows]


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
    """Q4_1 groups in 320-byte records: per row its 16 code bytes as 4-byte words, then float16 scales, mins."""
    num_rows, num_cols = groups.shape
    codes = _tiled(groups.codes).reshape(-1, TILE_ROWS, num_cols // 32, 32)  # [T, 16, G, 32]
    packed = codes[..., :16] | (codes[..., 16:] << 4)  # byte j: code j (low), code j + 16 (high), as Q4_1
    words = packed.reshape(*packed.shape[:3], 4, 4).permute(0, 2, 3, 1, 4)  # [T, G, word p, row r, byte b]
    data = torch.cat([words.reshape(*words.shape[:2], 256), _half_bytes(groups.scales), _half_bytes(groups.mins)],
                     dim=-1)
    return PackedWeight(data.contiguous(), 4, num_rows, num_cols)


def pack_int8(groups: Int8Groups) -> PackedWeight:
    """Q8_0 groups in 544-byte records: codes + 128 as unsigned 4-byte words per row, then float16 scales."""
    num_rows, num_cols = groups.shape
    unsigned = (groups.codes.to(torch.int16) + 128).to(torch.uint8)
    codes = _tiled(unsigned).reshape(-1, TILE_ROWS, num_cols // 32, 8, 4).permute(0, 2, 3, 1, 4)
    data = torch.cat([codes.reshape(*codes.shape[:2], 512), _half_bytes(groups.scales)], dim=-1)
    return PackedWeight(data.contiguous(), 8, num_rows, num_cols)
