"""Load an HF-format Llama checkpoint directory (config.json, *.safetensors, tokenizer.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from engine.model.config import LlamaConfig
from engine.tokenizer import Tokenizer
from engine.weights.layout import check_state_dict

_LLAMA_ARCHITECTURES = ("LlamaForCausalLM",)


def load_hf_dir(path: Path, dtype: torch.dtype) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    """Config, state dict (in ``dtype``) and tokenizer of a ``LlamaForCausalLM`` directory."""
    path = Path(path)
    raw = _read_json(path / "config.json", required=True)
    config = config_from_hf(raw, source=path / "config.json")

    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{path}: no *.safetensors weights (PyTorch .bin checkpoints are not supported)")
    state_dict: dict[str, torch.Tensor] = {}
    for shard in shards:
        for name, tensor in load_file(str(shard)).items():
            state_dict[name] = tensor.to(dtype)
    if config.tie_word_embeddings:
        # NOTE: some tied checkpoints still store the head; the engine's contract is to omit it.
        state_dict.pop("lm_head.weight", None)
    check_state_dict(config, state_dict, str(path))

    tokenizer_json = path / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json (slow sentencepiece-only tokenizers are not supported)")
    tokenizer_config = _read_json(path / "tokenizer_config.json", required=False)
    generation = _read_json(path / "generation_config.json", required=False)
    eos_value = generation.get("eos_token_id", raw.get("eos_token_id"))
    tokenizer = Tokenizer.from_file(
        tokenizer_json,
        bos_token_id=config.bos_token_id,
        eos_token_ids=_id_list(eos_value) or config.eos_token_ids,
        chat_template=_chat_template(path, tokenizer_config),
    )
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{path}: tokenizer has {tokenizer.vocab_size} ids but the model only {config.vocab_size}")
    return config, state_dict, tokenizer


def config_from_hf(raw: dict[str, Any], source: Path | str) -> LlamaConfig:
    """A :class:`LlamaConfig` from ``LlamaForCausalLM``-style ``config.json`` keys."""
    architectures = raw.get("architectures") or []
    if raw.get("model_type") != "llama" and not set(architectures) & set(_LLAMA_ARCHITECTURES):
        raise ValueError(
            f"{source}: model_type {raw.get('model_type')!r} / architectures {architectures} is not a Llama "
            f"model; supported: {_LLAMA_ARCHITECTURES}"
        )
    for key, allowed in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if key in raw and raw[key] != allowed:
            raise ValueError(f"{source}: {key}={raw[key]!r} is not supported (expected {allowed!r})")
    # transformers 5 writes rope_parameters {rope_theta, rope_type}; 4.x wrote rope_theta and rope_scaling.
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"{source}: RoPE scaling {rope_type!r} is not supported")
    rope_theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
    missing = [key for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if key not in raw]
    if missing:
        raise ValueError(f"{source}: config.json lacks {missing}")
    num_heads = int(raw["num_attention_heads"])
    return LlamaConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=None if raw.get("head_dim") is None else int(raw["head_dim"]),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=None if raw.get("bos_token_id") is None else int(raw["bos_token_id"]),
        eos_token_ids=_id_list(raw.get("eos_token_id")),
    )


def _id_list(value: object) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and all(isinstance(item, int) for item in value):
        return list(value)
    raise ValueError(f"eos_token_id must be an int or a list of ints, got {value!r}")


def _chat_template(path: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The template from ``chat_template.jinja`` or ``tokenizer_config.json`` (plain or named "default")."""
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} does not exist (not an HF model directory?)")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data
