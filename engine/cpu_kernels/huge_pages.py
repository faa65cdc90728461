"""The packed weights a decode step streams, moved onto transparent huge pages (2 MiB) in one mapping.

Why: a one-row decode step reads every weight once, and its speed is the rate at which the CPU reads memory.
Each packed projection of a small model is under 2 MiB, so the allocator puts them on the heap's 4 KiB pages,
where each 4 KiB of a stream costs a TLB miss and restarts the hardware prefetcher. On 2 MiB pages the same
reads run faster (docs/results.md, run 12, has the figures). The kernels read the weights through the
tensors' addresses, so a move changes no result.

Where the kernel cannot give huge pages (THP ``never``, another OS) the mapping stays on small pages and
nothing else changes; :meth:`HugePageArena.huge_bytes` says how much of it the kernel backed with huge pages.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import mmap
import re
from typing import TYPE_CHECKING

import torch

from engine.model.kernel_projection import KernelQuantProjection

if TYPE_CHECKING:
    from engine.model.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
_ALIGN = 64  # each tensor starts on a cache line, as the allocator's do


class HugePageArena:
    """One anonymous mapping of ``nbytes``, advised onto huge pages before any page of it is touched, handed out in
    cache-line aligned slices. The slices are views of it: the arena lives as long as any of them."""

    def __init__(self, nbytes: int) -> None:
        mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            mapping.madvise(mmap.MADV_HUGEPAGE)
        # NOTE: the tensor holds the mapping's buffer, so the mapping stays as long as any view of it
        whole = torch.frombuffer(mapping, dtype=torch.uint8)
        start = -whole.data_ptr() % HUGE_PAGE  # the first huge page boundary inside the mapping
        self._bytes = whole[start:start + nbytes]
        self._used = 0

    def empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized tensor in the arena's next free bytes (never touched before: zero)."""
        nbytes = math.prod(shape) * dtype.itemsize
        end = self._used + nbytes
        if end > self._bytes.numel():
            raise ValueError(f"the arena has {self._bytes.numel() - self._used} bytes left, not {nbytes}")
        view = self._bytes[self._used:end].view(dtype).view(shape)
        self._used = -(-end // _ALIGN) * _ALIGN
        return view

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of contiguous CPU ``tensor`` in the arena's next free bytes (a view of the same shape and dtype)."""
        return self.empty(tensor.shape, tensor.dtype).copy_(tensor)

    @property
    def nbytes(self) -> int:
        return self._bytes.numel()

    def huge_bytes(self) -> int:
        """Bytes of this mapping on huge pages now (``AnonHugePages`` in /proc/self/smaps); 0 where unreadable."""
        address = self._bytes.data_ptr()
        inside = False
        try:
            with open("/proc/self/smaps", encoding="ascii") as smaps:
                for line in smaps:
                    span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
                    if span:
                        inside = int(span.group(1), 16) <= address < int(span.group(2), 16)
                    elif inside and line.startswith("AnonHugePages:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0


def kernel_projections(model: LlamaForCausalLM) -> list[KernelQuantProjection]:
    """The model's projections that the C kernel multiplies (every layer's four and the LM head), in reading order."""
    candidates = [proj for layer in model.model.layers for proj in (
        layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    return [proj for proj in (*candidates, model.lm_head) if isinstance(proj, KernelQuantProjection)]


def move_onto_huge_pages(projections: list[KernelQuantProjection]) -> HugePageArena | None:
    """Copy every projection's packed codes into one arena, in order, and point the projection at its copy."""
    if not projections:
        return None
    arena = HugePageArena(sum(-(-p.packed.nbytes // _ALIGN) * _ALIGN for p in projections))
    for projection in projections:
        projection.packed = dataclasses.replace(projection.packed, data=arena.take(projection.packed.data))
    if logger.isEnabledFor(logging.INFO):  # reading /proc/self/smaps costs a start-up milliseconds for a log line
        logger.info("packed weights: %.1f of %.1f MB on huge pages", arena.huge_bytes() / 1e6, arena.nbytes / 1e6)
    return arena
