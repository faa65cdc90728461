"""C kernels for the CPU's optimized path, compiled on this machine at first use and cached.

Why C and not torch: a decode step's attention over a paged cache, done with torch ops, gathers
every sequence's blocks into a batch padded to its longest context and multiplies the padding too;
at 15 sequences of mixed length on a 2-core CPU that was 81 ms of a 117 ms step (README, "Decode
attention on CPU"). The kernel here reads each sequence's blocks in place, once. It is built with
the machine's C compiler for the machine's own CPU (``-march=native``: the CPU differs between
machines) and linked against the OpenMP runtime torch already loaded, so it runs on torch's threads.
No compiler, or a failed build: :func:`cpu_kernels` says why and the engine keeps the torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.attention import AttentionMetadata
from engine.weights.fetch import default_cache_dir

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.c")
# NOTE: not -ffast-math: with -shared, GCC 12 links crtfastmath.o, which flushes denormals for the whole
# process on load and would change every torch op's numerics. These flags only let reductions vectorize.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno",
          "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros", "-freciprocal-math")
_INT64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_ARGTYPES = [_PTR, _PTR, _PTR, _PTR, _INT64, _PTR, _PTR, _INT64, _INT64, _INT64, _INT64, _INT64, ctypes.c_float,
             ctypes.c_int]


@dataclass(frozen=True, slots=True)
class CpuKernels:
    """The loaded library: one decode-attention entry per storage dtype."""

    path: Path
    entries: dict[torch.dtype, Any]  # storage dtype -> the library's paged_decode_* function

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


def _machine_key() -> str:
    """What the built code depends on besides its source: the compiler and this CPU's features."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        cpu = platform.processor()
    return f"{platform.machine()}|{cpu}"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build(compiler: str, out_dir: Path) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(CFLAGS), version, _machine_key()]).encode())
    target = out_dir / f"paged_decode-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *CFLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-800:]}")
        os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def cpu_kernels() -> tuple[CpuKernels | None, str]:
    """The built kernels, or None and why not (the reason is also what the engine logs)."""
    if platform.system() != "Linux":
        return None, f"the CPU kernels are built for Linux only, not {platform.system()}"
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler (cc or gcc, or $CC) on PATH"
    try:
        path = _build(compiler, default_cache_dir() / "kernels")
        library = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"building the CPU kernels failed: {exc}"
    entries = {torch.float32: library.paged_decode_f32, torch.bfloat16: library.paged_decode_bf16}
    for fn in entries.values():
        fn.argtypes = _ARGTYPES
        fn.restype = ctypes.c_int
    return CpuKernels(path, entries), f"built with {compiler} for this CPU: {path}"
