"""Parameter names and shapes of a Llama decoder, in HF naming and ``nn.Linear`` [out, in] layout."""

from __future__ import annotations

import torch

from engine.model.config import LlamaConfig


def parameter_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter the engine's model expects, in a fixed order (embeddings, layers, norm, head).

    ``lm_head.weight`` is absent when ``config.tie_word_embeddings``: the head reuses
    ``model.embed_tokens.weight``.
    """
    assert config.head_dim is not None
    hidden, head_dim = config.hidden_size, config.head_dim
    q_out = config.num_heads * head_dim
    kv_out = config.num_kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}"
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (q_out, hidden)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv_out, hidden)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv_out, hidden)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (hidden, q_out)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (config.intermediate_size, hidden)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (config.intermediate_size, hidden)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (hidden, config.intermediate_size)
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def check_state_dict(config: LlamaConfig, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Raise ``ValueError`` unless ``state_dict`` holds exactly the expected names with the expected shapes."""
    expected = parameter_shapes(config)
    missing = [name for name in expected if name not in state_dict]
    unexpected = [name for name in state_dict if name not in expected]
    if missing or unexpected:
        raise ValueError(
            f"{source}: weights do not match the Llama layout "
            f"(missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})"
        )
    for name, shape in expected.items():
        if tuple(state_dict[name].shape) != shape:
            raise ValueError(
                f"{source}: {name} has shape {tuple(state_dict[name].shape)}, expected {shape}"
            )
