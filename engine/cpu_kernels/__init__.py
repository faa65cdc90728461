"""C kernels for the CPU's optimized path, compiled on this machine at first use and cached.

Why C and not torch: a decode step's attention over a paged cache, done with torch ops, gathers
every sequence's blocks into a batch padded to its longest context and multiplies the padding too;
at 15 sequences of mixed length on a 2-core CPU that was 81 ms of a 117 ms step (docs/results.md,
"The engine"). The kernel here reads each sequence's blocks in place, once. It is built with
the machine's C compiler for the machine's own CPU (``-march=native``: the CPU differs between
machines) and linked against the OpenMP runtime torch already loaded, so it runs on torch's threads.
No compiler, or a failed build: :func:`cpu_kernels` says why and the engine keeps the torch path.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.attention import AttentionMetadata
from engine.cpu_kernels.build import build_library
from engine.cpu_kernels.quant_pack import PackedWeight
from engine.weights.fetch import default_cache_dir

logger = logging.getLogger(__name__)

_INT64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_ARGTYPES = [_PTR, _PTR, _PTR, _PTR, _INT64, _PTR, _PTR, _INT64, _INT64, _INT64, _INT64, _INT64, ctypes.c_float,
             ctypes.c_int]
_INT = ctypes.c_int
_QUANT_GEMM_ARGTYPES = [_PTR, _INT, _INT64, _INT64, _PTR, _INT, _INT, _INT64, _PTR, _INT, _INT]
_QUANT_ACTS_ARGTYPES = [_PTR, _INT, _INT64, _INT64, _INT, _PTR, _PTR, _PTR]


@dataclass(frozen=True, slots=True)
class CpuKernels:
    """The loaded library: one decode-attention entry per storage dtype, and the quantized GEMM."""

    path: Path
    entries: dict[torch.dtype, Any]  # storage dtype -> the library's paged_decode_* function
    library: Any  # the ctypes.CDLL
    isa: str  # the instructions the quantized GEMM was built with: "avx512-vnni", "avx2" or "scalar"

    def paged_decode(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention of ``query [B, H, D]`` (one token per sequence) over its paged context: ``[B, H, D]``."""
        entry = self.entries.get(query.dtype)
        if entry is None or k_cache.dtype != query.dtype or v_cache.dtype != query.dtype:
            raise TypeError(f"paged_decode runs float32 or bfloat16 with a cache of the same dtype, got "
                            f"{query.dtype} over {k_cache.dtype}")
        for name, tensor in (("query", query), ("k_cache", k_cache), ("v_cache", v_cache),
                             ("block_tables", block_tables), ("seq_lens", seq_lens)):
            if tensor.device.type != "cpu" or not tensor.is_contiguous():
                raise ValueError(f"paged_decode needs contiguous CPU tensors; {name} is not")
        if block_tables.dtype != torch.int64 or seq_lens.dtype != torch.int64:
            raise TypeError("block_tables and seq_lens must be int64")
        num_seqs, num_heads, head_dim = query.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        if num_heads % num_kv_heads or k_cache.shape[3] != head_dim or block_tables.shape[0] != num_seqs \
                or seq_lens.shape != (num_seqs,):
            raise ValueError(f"paged_decode shapes disagree: query {tuple(query.shape)}, cache "
                             f"{tuple(k_cache.shape)}, tables {tuple(block_tables.shape)}, lens {tuple(seq_lens.shape)}")
        out = torch.empty_like(query)
        if num_seqs == 0:
            return out
        rc = entry(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                   block_tables.shape[1], seq_lens.data_ptr(), out.data_ptr(), num_seqs, num_heads, num_kv_heads,
                   head_dim, block_size, scale, torch.get_num_threads())
        if rc != 0:
            raise MemoryError("paged_decode could not allocate its score buffer")
        return out

    def decode_attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """:func:`paged_decode` over a batch's decode rows: ``TorchAttentionBackend``'s ``decode``."""
        assert meta.decode_block_tables is not None and meta.decode_seq_lens is not None
        return self.paged_decode(query.contiguous(), k_cache, v_cache, meta.decode_block_tables,
                                 meta.decode_seq_lens, scale)

    def quant_gemm(self, x: torch.Tensor, weight: PackedWeight, out: torch.Tensor | None = None,
                   act_bits: int = 16) -> torch.Tensor:
        """``x [M, K] @ weight.T`` (float32 or bfloat16, the output in x's dtype) over the packed codes, the
        activations quantized to ``act_bits`` (16; or 8, for 4-bit weights only)."""
        if x.dtype not in (torch.float32, torch.bfloat16) or x.device.type != "cpu" or x.dim() != 2:
            raise TypeError(f"quant_gemm takes a 2-D float32 or bfloat16 CPU tensor, got {x.dtype} {tuple(x.shape)} "
                            f"on {x.device}")
        if x.shape[1] != weight.num_cols:
            raise ValueError(f"quant_gemm: x has {x.shape[1]} columns, the weight {weight.num_cols}")
        weight.check_act_bits(act_bits)
        x = x.contiguous()
        if out is None:
            out = x.new_empty((x.shape[0], weight.num_rows))
        elif out.dtype != x.dtype or tuple(out.shape) != (x.shape[0], weight.num_rows) or not out.is_contiguous():
            raise ValueError(f"quant_gemm: out must be contiguous {x.dtype} {(x.shape[0], weight.num_rows)}")
        is_bf16 = int(x.dtype == torch.bfloat16)
        rc = self.library.quant_gemm(x.data_ptr(), is_bf16, x.shape[0], x.shape[1], weight.data.data_ptr(),
                                     weight.bits, act_bits, weight.num_rows, out.data_ptr(), is_bf16,
                                     torch.get_num_threads())
        if rc != 0:
            raise MemoryError("quant_gemm could not allocate its activation scratch") if rc == -1 else \
                ValueError(f"quant_gemm refused its arguments (code {rc})")
        return out

    def quantize_activations(self, x: torch.Tensor, act_bits: int = 16) -> tuple[torch.Tensor, torch.Tensor,
                                                                                torch.Tensor]:
        """The kernel's own ``act_bits`` activations of ``x [M, K]``: ``(codes, steps, sums of x)`` per group of
        32, the codes as int16 in order whatever their width."""
        x = x.contiguous()
        num_rows, num_cols = x.shape
        codes = torch.empty((num_rows, num_cols), dtype=torch.int16)
        steps, sums = (torch.empty((num_rows, num_cols // 32)) for _ in range(2))
        rc = self.library.quant_activations(x.data_ptr(), int(x.dtype == torch.bfloat16), num_rows, num_cols,
                                            act_bits, codes.data_ptr(), steps.data_ptr(), sums.data_ptr())
        if rc != 0:
            raise ValueError(f"quant_activations refused its arguments (code {rc})")
        return codes, steps, sums


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def cpu_kernels() -> tuple[CpuKernels | None, str]:
    """The built kernels, or None and why not (the reason is also what the engine logs)."""
    if platform.system() != "Linux":
        return None, f"the CPU kernels are built for Linux only, not {platform.system()}"
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler (cc or gcc, or $CC) on PATH"
    try:
        path = build_library(compiler, default_cache_dir() / "kernels")
        return load_library(path), f"built with {compiler} for this CPU: {path}"
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"building the CPU kernels failed: {exc}"


def load_library(path: Path) -> CpuKernels:
    """The kernels of a built library (``build_library``)."""
    library = ctypes.CDLL(str(path))
    entries = {torch.float32: library.paged_decode_f32, torch.bfloat16: library.paged_decode_bf16}
    for fn in entries.values():
        fn.argtypes = _ARGTYPES
        fn.restype = ctypes.c_int
    library.quant_gemm.argtypes = _QUANT_GEMM_ARGTYPES
    library.quant_gemm.restype = ctypes.c_int
    library.quant_activations.argtypes = _QUANT_ACTS_ARGTYPES
    library.quant_activations.restype = ctypes.c_int
    library.quant_gemv_isa.restype = ctypes.c_char_p
    return CpuKernels(path, entries, library, library.quant_gemv_isa().decode())
