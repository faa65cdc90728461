"""HF transformers' LlamaForCausalLM holding exactly the engine's weights."""

from __future__ import annotations

import inspect

import torch
import transformers

from engine.model.config import LlamaConfig


def hf_model_from(config: LlamaConfig, state_dict: dict[str, torch.Tensor],
                  dtype: torch.dtype = torch.float32) -> transformers.LlamaForCausalLM:
    """Build HF's Llama from our config and HF-named weights (eager attention, eval mode)."""
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings, attn_implementation="eager",
    )
    model = transformers.LlamaForCausalLM(hf_config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise ValueError(f"weights do not fit HF's Llama: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.to(dtype).eval()


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name ``forward`` takes the KV cache under (transformers 5 renamed it to ``cache``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(output: object) -> object:
    """The KV cache an HF forward returned, under either of its names."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values  # type: ignore[attr-defined]
