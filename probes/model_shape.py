"""What the roofline needs of a model (parameter counts, KV bytes per token), recorded in ``run.json``.

Whoever starts a run knows its model: the probed server from its engine, ``servescope load`` from
the name the target serves (:func:`resolve_model_shape`); the report reads the shape from the
manifest and never loads a model itself.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The bundled default model has the architecture of the dummy smollm2-shape (its random twin).
_NAMED_SHAPES = {"smollm2-135m": "smollm2-shape"}


@dataclass(slots=True)
class ModelShape:
    """What the roofline needs of a model: its parameter counts and KV footprint, in one dtype."""

    name: str
    dtype: str
    num_params: int
    num_layer_params: int  # parameters of the decoder layers (the per-token matmuls)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    kv_bytes_per_token: int
    # Bytes of weights a decode step reads as the engine stores them (quantized codes and scales where the run
    # quantized them), when the engine that served it said so; else num_params in dtype.
    # NOTE: with --weights int4 the model's float32 bytes are 5.6 times what a step reads, and a roofline or a
    # single-stream bandwidth built on them read 5x above the machine's bandwidth.
    served_weight_bytes: int | None = None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes(self) -> int:
        if self.served_weight_bytes is not None:
            return self.served_weight_bytes
        return self.num_params * self.dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, name: str, config: Any, dtype: str, served_weight_bytes: int | None = None) -> ModelShape:
        """From an ``engine.model.config.LlamaConfig`` (and the bytes its engine's steps read, when known)."""
        embed = config.vocab_size * config.hidden_size
        head = 0 if config.tie_word_embeddings else embed
        layer_params = config.num_params - embed - head - config.hidden_size
        return cls(name=name, dtype=dtype, num_params=config.num_params, num_layer_params=layer_params,
                   vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=config.num_layers,
                   num_heads=config.num_heads, head_dim=config.head_dim,
                   kv_bytes_per_token=config.kv_bytes_per_token(DTYPE_BYTES[dtype]),
                   served_weight_bytes=served_weight_bytes)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelShape:
        # NOTE: manifests written before served_weight_bytes existed lack it (the fields with a default)
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)
                      if f.name in data or f.default is dataclasses.MISSING})


def resolve_model_shape(model: str | None, dtype: str = "float32") -> ModelShape | None:
    """The shape of a model named as on ``--model``, without loading weights; None when it cannot be known here."""
    if model is None or dtype not in DTYPE_BYTES:
        return None
    from engine.weights.dummy import DUMMY_CONFIGS

    dummy = _NAMED_SHAPES.get(model, model.removeprefix("dummy:") if model.startswith("dummy:") else None)
    if dummy in DUMMY_CONFIGS:
        return ModelShape.from_config(model, DUMMY_CONFIGS[dummy], dtype)
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        from engine.weights.hf_dir import config_from_hf

        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
        return ModelShape.from_config(model, config_from_hf(raw, path / "config.json"), dtype)
    return None

