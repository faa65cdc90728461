"""What a model is built from: HF-named weights, where they go, and which form each projection takes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from engine.model.config import LlamaConfig
from engine.model.kernel_projection import KernelQuantProjection
from engine.model.projection import (
    DenseProjection,
    Projection,
    ProjectionKind,
    packed_or_dense,
    quantized_projection,
)
from engine.model.quant import Int4Groups, Int8Groups
from engine.weights.layout import check_state_dict

if TYPE_CHECKING:
    from engine.cpu_kernels import CpuKernels
    from engine.cpu_kernels.quant_pack import PackedWeight


class Int4Source(Protocol):
    """A weight stored as 4-bit groups in the checkpoint (a GGUF Q4_1 tensor)."""

    def groups(self) -> Int4Groups: ...


class Int8Source(Protocol):
    """A weight stored as 8-bit groups in the checkpoint (a GGUF Q8_0 tensor)."""

    def groups(self) -> Int8Groups: ...


@dataclass(slots=True)
class ModelWeights:
    """HF-named weights and the projection form the model is built with.

    ``tensor`` gives a weight in the model's dtype on its device; ``linear`` builds one projection
    from one or more weights stacked along their output rows (fused Q/K/V, gate/up). ``int4``
    projections take their codes from ``int4_sources`` where the checkpoint stored them, else
    quantize the float weight. The LM head of an int4 model is int8: a 4-bit head costs the most
    accuracy for the least speed (llama.cpp keeps it wider too), and SmolLM2's GGUF stores it Q8_0.

    With ``kernels`` (the CPU's C kernels), int4 projections multiply the packed Q4_1 codes and the
    head the Q8_0 codes (``int8_sources``) in the kernel; with ``dense_from_rows`` each also keeps a
    dense (prepacked) copy in ``dtype`` for steps of that many rows or more; ``int4_act_bits`` is the
    width the kernel quantizes the int4 projections' activations to (the head's are 16-bit). Without
    ``kernels`` they run torch's int4 and int8 kernels.
    """

    config: LlamaConfig
    state_dict: Mapping[str, torch.Tensor]
    dtype: torch.dtype
    device: torch.device
    projection: ProjectionKind = "dense"
    int4_sources: Mapping[str, Int4Source] = field(default_factory=dict)
    source: str = "weights"
    kernels: CpuKernels | None = None
    int8_sources: Mapping[str, Int8Source] = field(default_factory=dict)
    dense_from_rows: int | None = None
    int4_act_bits: int = 16

    def __post_init__(self) -> None:
        check_state_dict(self.config, dict(self.state_dict), self.source)
        if self.projection not in ("dense", "packed", "int8", "int4"):
            raise ValueError(f"unknown projection form {self.projection!r}")

    def tensor(self, name: str) -> torch.Tensor:
        # NOTE: no copy when dtype and device already match: the model then shares the caller's
        # tensor, which it never writes.
        return self.state_dict[name].to(device=self.device, dtype=self.dtype)

    def linear(self, *names: str) -> Projection:
        if self.projection == "int4":
            groups = Int4Groups.cat([self._int4_groups(n) for n in names])
            if self.kernels is not None:
                from engine.cpu_kernels.quant_pack import pack_int4

                return self._kernel_projection(pack_int4(groups))
            return quantized_projection("int4", torch.empty(0, dtype=self.dtype, device=self.device), groups)
        return self._projection(self.projection, self._dense(names))

    def lm_head(self, name: str) -> Projection:
        if self.projection == "int4" and self.kernels is not None:
            from engine.cpu_kernels.quant_pack import pack_int8

            source = self.int8_sources.get(name)
            groups = source.groups() if source is not None else Int8Groups.from_float(self.state_dict[name])
            return KernelQuantProjection(self.kernels, pack_int8(groups))  # a head's rows are sampled rows: few
        kind: ProjectionKind = "int8" if self.projection == "int4" else self.projection
        return self._projection(kind, self.tensor(name))

    def _dense(self, names: tuple[str, ...]) -> torch.Tensor:
        return self.tensor(names[0]) if len(names) == 1 else torch.cat([self.tensor(n) for n in names])

    def _kernel_projection(self, packed: PackedWeight) -> Projection:
        assert self.kernels is not None
        if self.dense_from_rows is None:
            return KernelQuantProjection(self.kernels, packed, act_bits=self.int4_act_bits)
        # NOTE: the dense copy is the packed weight itself (a GGUF's dequantized codes), so both paths multiply
        # the same numbers whichever a step takes.
        dense = packed_or_dense(packed.dequantize().to(device=self.device, dtype=self.dtype))
        return KernelQuantProjection(self.kernels, packed, dense, self.dense_from_rows, self.int4_act_bits)

    def _projection(self, kind: ProjectionKind, weight: torch.Tensor) -> Projection:
        if kind == "dense":
            return DenseProjection(weight)
        if kind == "packed":
            return packed_or_dense(weight)
        assert kind == "int8", "int4 projections are built from groups (linear)"
        return quantized_projection("int8", weight)

    def _int4_groups(self, name: str) -> Int4Groups:
        source = self.int4_sources.get(name)
        return source.groups() if source is not None else Int4Groups.from_float(self.state_dict[name])
