"""Resolve a model name to a config, HF-named weights and a tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.model.config import LlamaConfig
from engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from engine.weights.gguf_quant import Q4_1Tensor, Q8_0Tensor

DEFAULT_MODEL = "smollm2-135m"
DUMMY_PREFIX = "dummy:"

ACCEPTED_FORMS = (
    f"'{DEFAULT_MODEL}' (fetched GGUF), 'dummy:<name>' (random weights), "
    "a path to a .gguf file, or a directory holding config.json and *.safetensors"
)


@dataclass(slots=True)
class LoadedModel:
    """Everything the engine needs from a checkpoint; ``source`` says where it came from."""

    config: LlamaConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    name: str
    source: str
    # GGUF Q4_1 tensors as stored, by HF name: the int4 path reads their codes instead of requantizing.
    int4_weights: dict[str, Q4_1Tensor] = field(default_factory=dict)
    # GGUF Q8_0 tensors as stored (SmolLM2's tied embedding and LM head): the int4 path's head reads them.
    int8_weights: dict[str, Q8_0Tensor] = field(default_factory=dict)


def load_model(name: str = DEFAULT_MODEL, dtype: torch.dtype = torch.float32, seed: int = 0) -> LoadedModel:
    """Load ``name``: one of :data:`ACCEPTED_FORMS`. ``seed`` only matters for dummy models."""
    # Imported here so `import engine.weights` stays cheap (gguf, safetensors load on first use).
    if name == DEFAULT_MODEL:
        from engine.weights.fetch import fetch_smollm2
        from engine.weights.gguf_loader import load_gguf

        path = fetch_smollm2()
        config, state_dict, tokenizer, q4_1, q8_0 = load_gguf(path, dtype)
        return LoadedModel(config, state_dict, tokenizer, name=name, source=str(path), int4_weights=q4_1,
                           int8_weights=q8_0)
    if name.startswith(DUMMY_PREFIX):
        from engine.weights.dummy import load_dummy

        dummy = name.removeprefix(DUMMY_PREFIX)
        return LoadedModel(*load_dummy(dummy, dtype, seed), name=name, source=f"dummy (seed {seed})")
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        from engine.weights.gguf_loader import load_gguf

        config, state_dict, tokenizer, q4_1, q8_0 = load_gguf(path, dtype)
        return LoadedModel(config, state_dict, tokenizer, name=name, source=str(path), int4_weights=q4_1,
                           int8_weights=q8_0)
    if path.is_dir() and (path / "config.json").is_file():
        from engine.weights.hf_dir import load_hf_dir

        return LoadedModel(*load_hf_dir(path, dtype), name=name, source=str(path))
    raise ValueError(f"cannot load model {name!r}; expected {ACCEPTED_FORMS}")


__all__ = ["ACCEPTED_FORMS", "DEFAULT_MODEL", "LoadedModel", "load_model"]
