"""A decode step of an int4 model in one C call (``decode_step.c``): the CPU's counterpart of CUDA graphs.

The runner uses it for steps whose every row is a decode row, on the optimized CPU path, when every
projection of the model is a 4-bit kernel projection (``--weights int4`` with the C kernels built).
It reads the model's own tensors (packed codes, norm weights, rotary tables) and the runner's KV
cache in place; nothing is copied. Prompt chunks and mixed steps run the model's ``forward``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.attention import AttentionMetadata, padded_tables
from engine.model.kernel_projection import KernelQuantProjection

if TYPE_CHECKING:
    from engine.cpu_kernels import CpuKernels
    from engine.model.llama import KVCache, LlamaForCausalLM

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


class _DecodeModel(ctypes.Structure):
    """``DecodeModel`` of decode_step.c, field for field."""

    _fields_ = [("num_layers", _I64), ("hidden", _I64), ("num_heads", _I64), ("num_kv_heads", _I64),
                ("head_dim", _I64), ("intermediate", _I64), ("block_size", _I64), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("is_bf16", ctypes.c_int32), ("act_bits", ctypes.c_int32),
                ("qkv", _PTR), ("o", _PTR), ("gate_up", _PTR), ("down", _PTR), ("input_norm", _PTR),
                ("post_norm", _PTR), ("final_norm", _PTR), ("k_cache", _PTR), ("v_cache", _PTR), ("cos", _PTR), ("sin", _PTR),
                ("embed", _PTR), ("head", _PTR), ("vocab", _I64), ("head_bits", ctypes.c_int32),
                ("head_act_bits", ctypes.c_int32)]


@dataclass(slots=True)
class DecodeRows:
    """A step's M one-token rows as the C step reads them, in one int64 tensor: the token ids, positions, cache
    slots and context lengths (M each), then the block tables ``[M, width]`` padded with 0.

    NOTE: one tensor made from one list: the general ``AttentionMetadata.build`` (two tensors and a dozen views,
    for every kind of step) took 67 us of a one-row decode step's ~4 ms (2-core EPYC, 2026-12-07).
    """

    longs: torch.Tensor
    num_rows: int
    width: int

    @classmethod
    def build(cls, token_ids: list[int], positions: list[int], slots: list[int], seq_lens: list[int],
              tables: list[list[int]]) -> DecodeRows:
        padded, width = padded_tables(tables)
        longs = torch.tensor(token_ids + positions + slots + seq_lens + padded, dtype=torch.int64)
        return cls(longs, len(token_ids), width)

    def pointer(self, part: int) -> int:
        """The address of part 0-4 (ids, positions, slots, lengths, tables)."""
        return self.longs.data_ptr() + 8 * self.num_rows * part


class FusedDecodeStep:
    """``model.forward`` (``run``), or that and the LM head (``logits``), for an all-decode batch in one C call."""

    def __init__(self, kernels: CpuKernels, model: LlamaForCausalLM, kv_caches: list[KVCache]) -> None:
        problem = why_not_fused(model, kv_caches)
        if problem is not None:
            raise ValueError(f"the fused decode step cannot run this model: {problem}")
        inner = model.model
        layers = list(inner.layers)
        attn0 = layers[0].self_attn
        config = model.config
        head = model.lm_head
        assert isinstance(head, KernelQuantProjection)
        self._embed = inner.embed_tokens
        self._dtype = self._embed.dtype
        self._hidden = config.hidden_size

        def pointers(tensors: list[torch.Tensor]) -> torch.Tensor:
            return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)

        # NOTE: these int64 tensors of addresses must live as long as this object; the model and the runner
        # keep the tensors they point at.
        self._tables = {
            "qkv": pointers([layer.self_attn.qkv_proj.packed.data for layer in layers]),
            "o": pointers([layer.self_attn.o_proj.packed.data for layer in layers]),
            "gate_up": pointers([layer.mlp.gate_up_proj.packed.data for layer in layers]),
            "down": pointers([layer.mlp.down_proj.packed.data for layer in layers]),
            "input_norm": pointers([layer.input_layernorm.weight for layer in layers]),
            "post_norm": pointers([layer.post_attention_layernorm.weight for layer in layers]),
            "k_cache": pointers([k for k, _ in kv_caches]),
            "v_cache": pointers([v for _, v in kv_caches]),
        }
        cos, sin = inner.rotary.cos, inner.rotary.sin
        self._md = _DecodeModel(
            num_layers=len(layers), hidden=config.hidden_size, num_heads=attn0.num_heads,
            num_kv_heads=attn0.num_kv_heads, head_dim=attn0.head_dim, intermediate=config.intermediate_size,
            block_size=kv_caches[0][0].shape[1], eps=inner.norm.eps, scale=attn0.scale,
            is_bf16=int(self._dtype == torch.bfloat16), act_bits=attn0.qkv_proj.act_bits,
            final_norm=inner.norm.weight.data_ptr(), cos=cos.data_ptr(), sin=sin.data_ptr(),
            embed=self._embed.data_ptr(), head=head.packed.data.data_ptr(), vocab=head.packed.num_rows,
            head_bits=head.packed.bits, head_act_bits=head.act_bits,
            **{k: v.data_ptr() for k, v in self._tables.items()})
        self._fn = kernels.library.decode_step
        self._fn.argtypes = [ctypes.POINTER(_DecodeModel), _I64, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR,
                             _PTR, ctypes.c_int]
        self._fn.restype = ctypes.c_int
        self._md_ref = ctypes.byref(self._md)
        # Reused across steps (a row of logits is 196 KB in float32): residual and hidden [2, capacity, hidden]
        self._rows = torch.empty((2, 0, self._hidden), dtype=self._dtype)
        self._logits = torch.empty((0, self._md.vocab))

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Final hidden states ``[M, hidden]`` of M decode rows (every row of ``meta`` a decode row, in order), fresh."""
        tables, seq_lens = meta.decode_block_tables, meta.decode_seq_lens
        assert tables is not None and seq_lens is not None and len(meta.decode_ids) == meta.num_seqs
        num_rows = input_ids.shape[0]
        residual, hidden = torch.empty((2, num_rows, self._hidden), dtype=self._dtype)
        self._call(num_rows, input_ids.data_ptr(), positions.data_ptr(), meta.slot_mapping.data_ptr(),
                   tables.data_ptr(), tables.shape[1], seq_lens.data_ptr(), residual, hidden, 0)
        return hidden

    def logits(self, rows: DecodeRows) -> torch.Tensor:
        """The LM head's float32 logits ``[M, vocab]`` after the step, as ``compute_logits`` gives them.

        The tensor is reused: the next call overwrites it.
        """
        num_rows = rows.num_rows
        if self._logits.shape[0] < num_rows:
            self._rows = torch.empty((2, num_rows, self._hidden), dtype=self._dtype)
            self._logits = torch.empty((num_rows, self._md.vocab))
        logits = self._logits[:num_rows]
        self._call(num_rows, rows.pointer(0), rows.pointer(1), rows.pointer(2), rows.pointer(4), rows.width,
                   rows.pointer(3), self._rows[0], self._rows[1], logits.data_ptr())
        return logits

    def _call(self, num_rows: int, ids: int, positions: int, slots: int, tables: int, width: int, seq_lens: int,
              residual: torch.Tensor, hidden: torch.Tensor, logits: int) -> None:
        """The C step over addresses; ``residual`` and ``hidden`` contiguous, at least ``num_rows`` rows each."""
        rc = self._fn(self._md_ref, num_rows, ids, positions, slots, tables, width, seq_lens, residual.data_ptr(),
                      hidden.data_ptr(), logits or None, torch.get_num_threads())
        if rc == -2:
            raise ValueError(f"a token id is outside the vocabulary of {self._md.vocab}")
        if rc != 0:
            raise MemoryError("the fused decode step could not allocate its scratch")


def why_not_fused(model: LlamaForCausalLM, kv_caches: list[KVCache]) -> str | None:
    """Why ``FusedDecodeStep`` cannot run ``model`` (None when it can)."""
    inner = model.model
    dtype = inner.embed_tokens.dtype
    if dtype not in (torch.float32, torch.bfloat16):
        return f"dtype {dtype} (it runs float32 and bfloat16)"
    if inner.embed_tokens.device.type != "cpu":
        return f"the model is on {inner.embed_tokens.device}"
    act_bits = set()
    for layer in inner.layers:
        for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            if not isinstance(proj, KernelQuantProjection) or proj.packed.bits != 4:
                return f"a projection is {proj.kind}, not int4-kernel"
            act_bits.add(proj.act_bits)
    head = model.lm_head
    if not isinstance(head, KernelQuantProjection) or head.dense is not None:
        return f"the LM head is {getattr(head, 'kind', type(head).__name__)}, not a kernel projection of its own"
    if len(act_bits) > 1:
        return f"the projections quantize their activations to different widths ({sorted(act_bits)} bits)"
    head_dim = inner.layers[0].self_attn.head_dim
    if head_dim % 2 or inner.rotary.cos.dtype != torch.float32:
        return "the rotary table is not float32 over an even head dimension"
    for k, v in kv_caches:
        if k.dtype != dtype or v.dtype != dtype or not (k.is_contiguous() and v.is_contiguous()):
            return "the KV cache is not contiguous in the model's dtype"
    return None
