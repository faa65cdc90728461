"""Load a Llama GGUF file: config from metadata, every tensor dequantized, tokenizer from metadata."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from engine.model.config import LlamaConfig
from engine.tokenizer import GGUF_EOS_KEYS, Tokenizer
from engine.weights.gguf_quant import Q4_1Tensor, Q8_0Tensor
from engine.weights.layout import check_state_dict

# GGUF tensor name (after "blk.N.") -> HF name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_SUPPORTED_ARCHITECTURES = ("llama",)


def load_gguf(path: Path, dtype: torch.dtype) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer,
                                                       dict[str, Q4_1Tensor], dict[str, Q8_0Tensor]]:
    """Config, HF-named state dict (in ``dtype``), tokenizer, Q4_1 and Q8_0 tensors of a Llama GGUF file.

    Quantized tensors (Q4_1, Q8_0, ...) are dequantized with ``gguf.quants``; q/k projections are
    un-permuted from llama.cpp's interleaved rotary layout back to HF's rotate-half layout. The
    Q4_1 and (unpermuted) Q8_0 ones are also returned as stored (by HF name), for the quantized
    paths to use their own codes.
    """
    reader = _open(path)
    metadata = _metadata(reader)
    has_output = any(tensor.name == "output.weight" for tensor in reader.tensors)
    config = config_from_metadata(metadata, has_output_tensor=has_output, source=path)
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"{path}: tokenizer has {tokenizer.vocab_size} ids, model {config.vocab_size}")

    state_dict: dict[str, torch.Tensor] = {}
    q4_1: dict[str, Q4_1Tensor] = {}
    q8_0: dict[str, Q8_0Tensor] = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        # NOTE: GGUF lists dimensions fastest-first (ne0 = columns), the reverse of torch's order.
        shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
        # np.asarray drops the memmap subclass, whose per-slice overhead doubles dequantize time.
        array = dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(shape)
        if not array.flags.writeable:  # unquantized tensors come back as views of the memory map
            array = array.copy()
        weight = torch.from_numpy(array.astype(np.float32, copy=False))
        rotary_heads = None
        if name.endswith("self_attn.q_proj.weight"):
            rotary_heads = config.num_heads
        elif name.endswith("self_attn.k_proj.weight"):
            rotary_heads = config.num_kv_heads
        if rotary_heads is not None:
            weight = unpermute_rotary_rows(weight, rotary_heads)
        state_dict[name] = weight.to(dtype)
        if tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1 and len(shape) == 2:
            order = None if rotary_heads is None else \
                unpermute_rotary_rows(torch.arange(shape[0]).unsqueeze(1), rotary_heads).squeeze(1)
            q4_1[name] = Q4_1Tensor(np.asarray(tensor.data), (shape[0], shape[1]), order)
        elif tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0 and len(shape) == 2 and rotary_heads is None:
            q8_0[name] = Q8_0Tensor(np.asarray(tensor.data), (shape[0], shape[1]))

    check_state_dict(config, state_dict, str(path))
    return config, state_dict, tokenizer, q4_1, q8_0


def load_gguf_tokenizer(path: Path) -> Tokenizer:
    """Only the tokenizer of a GGUF file (reads the metadata, no tensor data)."""
    return Tokenizer.from_gguf_metadata(_metadata(_open(path)))


def config_from_metadata(metadata: dict[str, Any], *, has_output_tensor: bool, source: Path | str) -> LlamaConfig:
    """Architecture from ``{arch}.*`` metadata; tied embeddings when the file has no ``output`` tensor."""
    arch = metadata.get("general.architecture")
    if arch not in _SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{source}: unsupported GGUF architecture {arch!r}; supported: {_SUPPORTED_ARCHITECTURES}")

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in metadata:
            raise ValueError(f"{source}: GGUF metadata lacks {arch}.{key}")
        return metadata[f"{arch}.{key}"]

    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{source}: RoPE scaling {scaling!r} is not supported")
    num_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(metadata.get(f"{arch}.attention.key_length", hidden // num_heads))
    rope_dims = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"{source}: partial rotary ({rope_dims} of {head_dim} dims) is not supported")
    vocab_size = len(metadata["tokenizer.ggml.tokens"])
    declared_vocab = metadata.get(f"{arch}.vocab_size")
    if declared_vocab is not None and int(declared_vocab) != vocab_size:
        raise ValueError(f"{source}: {arch}.vocab_size is {declared_vocab} but the file lists {vocab_size} tokens")
    eos_ids = [int(metadata[key]) for key in GGUF_EOS_KEYS if metadata.get(key) is not None]
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rope_theta=_short_float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=_short_float(need("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(need("context_length")),
        tie_word_embeddings=not has_output_tensor,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=list(dict.fromkeys(eos_ids)),
    )


def hf_tensor_name(gguf_name: str) -> str:
    """HF parameter name of a GGUF tensor name; ``ValueError`` for tensors the engine has no slot for."""
    match = _LAYER_PATTERN.fullmatch(gguf_name)
    if match is not None and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.weight"
    stem = gguf_name.removesuffix(".weight")
    if gguf_name.endswith(".weight") and stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.weight"
    raise ValueError(f"unsupported GGUF tensor {gguf_name!r} (not part of a plain Llama decoder)")


def unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: per head, rows (0, half, 1, half+1, ...) -> (0, 1, ..., half, ...).

    llama.cpp rotates adjacent pairs (x[2i], x[2i+1]); HF rotates halves (x[i], x[i + d/2]).
    The converter interleaves each head's two halves so the same weights work; this splits them again.
    """
    out_features, in_features = weight.shape
    head_dim = out_features // num_heads
    if head_dim * num_heads != out_features or head_dim % 2 != 0:
        raise ValueError(f"cannot split {out_features} rows into {num_heads} heads of even size")
    # [H, D/2, 2, in] (interleaved pairs) -> [H, 2, D/2, in] (halves)
    return (weight.reshape(num_heads, head_dim // 2, 2, in_features)
            .transpose(1, 2).reshape(out_features, in_features).contiguous())


def _short_float(value: Any) -> float:
    # NOTE: GGUF stores float32; 1e-5 reads back as 9.99999974e-06. The shortest decimal that
    # round-trips through float32 recovers the value the model was configured with.
    return float(str(np.float32(value)))


def _open(path: Path) -> gguf.GGUFReader:
    if not Path(path).is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    return gguf.GGUFReader(path)


def _metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Metadata values decoded to Python (str, int, float, lists), minus the file-format header."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
