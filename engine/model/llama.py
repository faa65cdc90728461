"""A plain-PyTorch Llama-family decoder that reads and writes a paged KV cache.

The model is built from its weights (``ModelWeights``): Q/K/V and gate/up are fused, every
projection takes the form chosen for this build (dense, prepacked, int8, int4) and every layer
calls the kernels chosen for it (``ModelOps``). ``forward`` is one path whatever was chosen.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention import AttentionMetadata
from engine.model.config import LlamaConfig
from engine.model.ops import ModelOps
from engine.model.projection import Projection
from engine.model.weights import ModelWeights

KVCache = tuple[torch.Tensor, torch.Tensor]  # per layer: K and V, [num_blocks, block_size, KVH, D]
Rope = tuple[torch.Tensor, torch.Tensor]  # cos and sin ``[T, 1, D/2]`` of this step's positions


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float, ops: ModelOps) -> None:
        super().__init__()
        self.weight = weight  # [hidden]
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + x), residual + x)``: the residual add fused into the norm."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a precomputed float32 cos/sin table indexed by absolute position."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, device: torch.device) -> None:
        super().__init__()
        arange = torch.arange(0, head_dim, 2, dtype=torch.float64)
        inv_freq = 1.0 / (theta ** (arange / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)  # [P, D/2]
        self.cos = freqs.cos().float().to(device)
        self.sin = freqs.sin().float().to(device)

    def lookup(self, positions: torch.Tensor) -> Rope:
        """The tables' rows for this step's positions, looked up once and shared by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    @staticmethod
    def rotate(x: torch.Tensor, rope: Rope) -> torch.Tensor:
        """x ``[T, heads, D]`` rotated by each token's position."""
        cos, sin = rope
        x32 = x.float()
        x1, x2 = x32.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, weights: ModelWeights, prefix: str, ops: ModelOps) -> None:
        super().__init__()
        assert config.head_dim is not None
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj: Projection = weights.linear(f"{prefix}.q_proj.weight", f"{prefix}.k_proj.weight",
                                                   f"{prefix}.v_proj.weight")
        self.o_proj: Projection = weights.linear(f"{prefix}.o_proj.weight")
        self.backend = ops.attention

    def forward(self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # [T, (H + 2 KVH) * D]
        # NOTE: Q and K sit side by side in the fused output, so one rotation covers both.
        qk = RotaryEmbedding.rotate(qkv[:, :(heads + kv_heads) * head_dim].view(num_tokens, -1, head_dim), rope)
        q, k = qk.split([heads, kv_heads], dim=1)
        v = qkv[:, (heads + kv_heads) * head_dim:].view(num_tokens, kv_heads, head_dim)
        k_cache, v_cache = kv_cache
        self.backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        attn = self.backend.attend(q, k_cache, v_cache, meta, self.scale).reshape(num_tokens, heads * head_dim)
        return self.o_proj(attn)


class LlamaMLP(nn.Module):
    def __init__(self, weights: ModelWeights, prefix: str, ops: ModelOps) -> None:
        super().__init__()
        self.gate_up_proj: Projection = weights.linear(f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight")
        self.down_proj: Projection = weights.linear(f"{prefix}.down_proj.weight")
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, weights: ModelWeights, index: int, ops: ModelOps) -> None:
        super().__init__()
        prefix = f"model.layers.{index}"
        self.input_layernorm = RMSNorm(weights.tensor(f"{prefix}.input_layernorm.weight"), config.rms_norm_eps, ops)
        self.self_attn = LlamaAttention(config, weights, f"{prefix}.self_attn", ops)
        self.post_attention_layernorm = RMSNorm(weights.tensor(f"{prefix}.post_attention_layernorm.weight"),
                                                config.rms_norm_eps, ops)
        self.mlp = LlamaMLP(weights, f"{prefix}.mlp", ops)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor, rope: Rope, kv_cache: KVCache,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden`` is this layer's normed input; returns the MLP's output and the residual before it."""
        hidden, residual = self.post_attention_layernorm.add(self.self_attn(hidden, rope, kv_cache, meta), residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, weights: ModelWeights, ops: ModelOps) -> None:
        super().__init__()
        assert config.head_dim is not None
        self.embed_tokens = weights.tensor("model.embed_tokens.weight")  # [V, hidden]
        self.rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                      weights.device)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, weights, i, ops) for i in range(config.num_layers))
        self.norm = RMSNorm(weights.tensor("model.norm.weight"), config.rms_norm_eps, ops)
        # Each layer's output is added into the residual and normed by the next layer's input norm.
        self.next_norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        residual = self.embed_tokens[input_ids]  # [T, hidden]
        rope = self.rotary.lookup(positions)
        hidden = self.layers[0].input_layernorm(residual)
        for layer, next_norm, kv_cache in zip(self.layers, self.next_norms, kv_caches, strict=True):
            out, residual = layer(hidden, residual, rope, kv_cache, meta)
            hidden, residual = next_norm.add(out, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """Decoder plus LM head, built from HF-named weights (``ModelWeights``)."""

    def __init__(self, config: LlamaConfig, weights: ModelWeights, ops: ModelOps) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.model = LlamaModel(config, weights, ops)
        head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        self.lm_head: Projection = weights.lm_head(head)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        """Final hidden states ``[T, hidden]`` for the flat batch of new tokens."""
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def decode_weight_bytes(self) -> int:
        """Bytes of weights a decode step reads as stored: every projection and the LM head (quantized codes and
        scales where quantized); the norms and one embedding row per token are left out (under 0.1%)."""
        total = self.lm_head.weight_bytes
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            total += sum(p.weight_bytes for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
        return total
