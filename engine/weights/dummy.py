"""Named dummy models: real Llama shapes with seeded random weights and a byte-level tokenizer."""

from __future__ import annotations

import copy
from types import MappingProxyType

import torch

from engine.model.config import LlamaConfig
from engine.tokenizer import Tokenizer
from engine.weights.layout import parameter_shapes

# NOTE: id 256 is <|endoftext|> in Tokenizer.byte_level; the configs' eos must stay in step with it.
_BYTE_LEVEL_EOS = 256

DUMMY_CONFIGS: MappingProxyType[str, LlamaConfig] = MappingProxyType({
    "tiny": LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=True, eos_token_ids=[_BYTE_LEVEL_EOS],
    ),
    "smollm2-shape": LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
        tie_word_embeddings=True, eos_token_ids=[_BYTE_LEVEL_EOS],
    ),
})

# Linear weights get std LINEAR_GAIN / sqrt(fan_in). With the plain 0.02 of HF's init, every
# sublayer adds far less than the tied embedding already holds, so the residual stream stays the
# current token's embedding and greedy decoding repeats the last token forever. Gain 2 makes the
# layers dominate (tiny: ~30 distinct tokens in 32 greedy steps, almost no self-repeats).
LINEAR_GAIN = 2.0


def load_dummy(name: str, dtype: torch.dtype, seed: int) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    """Config, seeded random state dict and byte-level tokenizer of dummy model ``name``.

    The same ``(name, seed)`` gives bit-identical float32 weights on every machine; other dtypes
    are those weights rounded. Norm weights are 1; embeddings have std 1/sqrt(hidden) so tied
    logits have std ~1.
    """
    if name not in DUMMY_CONFIGS:
        raise ValueError(f"unknown dummy model {name!r}; known: {sorted(DUMMY_CONFIGS)}")
    # NOTE: a copy, so a caller editing its config never changes the registry.
    config = copy.deepcopy(DUMMY_CONFIGS[name])
    generator = torch.Generator(device="cpu").manual_seed(seed)
    state_dict: dict[str, torch.Tensor] = {}
    for param_name, shape in parameter_shapes(config).items():
        if len(shape) == 1:
            weight = torch.ones(shape)
        else:
            std = config.hidden_size ** -0.5 if "embed_tokens" in param_name else LINEAR_GAIN * shape[1] ** -0.5
            weight = torch.randn(shape, generator=generator) * std
        state_dict[param_name] = weight.to(dtype)
    tokenizer = Tokenizer.byte_level(config.vocab_size)
    assert tokenizer.eos_token_ids == config.eos_token_ids
    return config, state_dict, tokenizer
