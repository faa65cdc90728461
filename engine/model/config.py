"""Architecture description of a Llama-family decoder."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class LlamaConfig:
    """Shape and numerics of a Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU).

    Filled from the weights file (GGUF metadata, HF ``config.json``) or from a named dummy
    configuration; the model, the KV cache and the roofline all read it.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_heads != 0:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) is not divisible by num_heads ({self.num_heads})"
                )
            self.head_dim = self.hidden_size // self.num_heads
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def num_params(self) -> int:
        """Parameter count, embeddings included once when tied."""
        assert self.head_dim is not None
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size
        per_layer = q + kv + o + mlp + norms
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * per_layer + embed + head + self.hidden_size

    def kv_bytes_per_token(self, dtype_size: int) -> int:
        """Bytes of K and V that one token occupies across all layers."""
        assert self.head_dim is not None
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_size
