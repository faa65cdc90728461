"""A plain-PyTorch Llama-family decoder that reads and writes a paged KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import TORCH_BACKEND, AttentionBackend, AttentionMetadata
from engine.model.config import LlamaConfig
from engine.model.projection import Projection, dense, packed_or_dense

KVCache = tuple[torch.Tensor, torch.Tensor]  # per layer: K and V, [num_blocks, block_size, KVH, D]
Rope = tuple[torch.Tensor, torch.Tensor]  # cos and sin ``[T, 1, D/2]`` of this step's positions


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: computed in float32 whatever the weights' dtype, as the HF reference does.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a precomputed cos/sin table indexed by absolute position."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        # NOTE: plain float32 tensors on an explicit device, not buffers: they are derived, not
        # weights, so building the model on the meta device or casting its dtype leaves them intact.
        arange = torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu")
        inv_freq = 1.0 / (theta ** (arange / head_dim))
        positions = torch.arange(max_positions, dtype=torch.float64, device="cpu")
        freqs = torch.outer(positions, inv_freq)  # [P, D/2]
        self.cos = freqs.cos().float()
        self.sin = freqs.sin().float()

    def move_to(self, device: torch.device) -> None:
        """Move the tables (Module.to does not see plain tensors); they stay float32."""
        self.cos = self.cos.to(device)
        self.sin = self.sin.to(device)

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


def _fuse_linears(*linears: nn.Linear) -> torch.Tensor:
    """Concatenate the weights along the output rows; the layers then view into the fused copy."""
    fused = torch.cat([lin.weight.detach() for lin in linears])
    offset = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        # NOTE: the originals become views so the model holds each weight once, fused or not.
        lin.weight.data = fused[offset:offset + rows]
        offset += rows
    return fused


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        assert config.head_dim is not None
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.rotary = rotary
        self.qkv_weight: torch.Tensor | None = None  # [(H + 2 KVH) * D, hidden] once fused
        self.qkv_op: Projection | None = None  # the fused GEMM, dense or prepacked
        self.o_op: Projection | None = None  # set when prepacked
        self.backend: AttentionBackend = TORCH_BACKEND

    def fuse(self) -> None:
        """One GEMM for Q, K and V instead of three (same weights, concatenated)."""
        self.qkv_weight = _fuse_linears(self.q_proj, self.k_proj, self.v_proj)
        self.qkv_op = dense(self.qkv_weight)

    def pack(self) -> None:
        """Prepack the fused QKV and the output projection for the CPU GEMM library."""
        assert self.qkv_weight is not None, "fuse before packing"
        self.qkv_op = packed_or_dense(self.qkv_weight)
        self.o_op = packed_or_dense(self.o_proj.weight)

    def forward(self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_op is not None:
            qkv = self.qkv_op(x)
            # NOTE: Q and K sit side by side in the fused output, so one rotation covers both.
            qk = self.rotary.rotate(qkv[:, :(heads + kv_heads) * head_dim].view(num_tokens, -1, head_dim), rope)
            q, k = qk.split([heads, kv_heads], dim=1)
            v = qkv[:, (heads + kv_heads) * head_dim:].view(num_tokens, kv_heads, head_dim)
        else:
            q = self.rotary.rotate(self.q_proj(x).view(num_tokens, heads, head_dim), rope)
            k = self.rotary.rotate(self.k_proj(x).view(num_tokens, kv_heads, head_dim), rope)
            v = self.v_proj(x).view(num_tokens, kv_heads, head_dim)
        k_cache, v_cache = kv_cache
        self.backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        attn = self.backend.attend(q, k_cache, v_cache, meta, self.scale).reshape(num_tokens, heads * head_dim)
        return self.o_op(attn) if self.o_op is not None else self.o_proj(attn)


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_weight: torch.Tensor | None = None  # [2 * intermediate, hidden] once fused
        self.gate_up_op: Projection | None = None  # the fused GEMM, dense or prepacked
        self.down_op: Projection | None = None  # set when prepacked

    def fuse(self) -> None:
        """One GEMM for the gate and up projections."""
        self.gate_up_weight = _fuse_linears(self.gate_proj, self.up_proj)
        self.gate_up_op = dense(self.gate_up_weight)

    def pack(self) -> None:
        """Prepack the fused gate/up and the down projection for the CPU GEMM library."""
        assert self.gate_up_weight is not None, "fuse before packing"
        self.gate_up_op = packed_or_dense(self.gate_up_weight)
        self.down_op = packed_or_dense(self.down_proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_op is not None:
            gate, up = self.gate_up_op(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        hidden = F.silu(gate) * up
        return self.down_op(hidden) if self.down_op is not None else self.down_proj(hidden)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        assert config.head_dim is not None
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)
        self.rotary = rotary
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, rotary) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary.lookup(positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, rope, kv_cache, meta)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """Decoder plus LM head; parameter names follow HF's ``LlamaForCausalLM``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.lm_head_op: Projection | None = None  # set when prepacked

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        """Final hidden states ``[T, hidden]`` for the flat batch of new tokens."""
        return self.model(input_ids, positions, kv_caches, meta)

    def fuse_projections(self) -> None:
        """Concatenate Q/K/V and gate/up weights so each layer runs 4 GEMMs instead of 7.

        NOTE: the fused copies are taken from the loaded weights; call after load_weights.
        """
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def pack_projections(self) -> None:
        """Prepack every GEMM weight for the CPU GEMM library (see engine/model/projection.py).

        NOTE: the packed copies are held beside the weights: on CPU this doubles weight memory.
        """
        for layer in self.model.layers:
            layer.self_attn.pack()
            layer.mlp.pack()
        self.lm_head_op = packed_or_dense(self.lm_head.weight)

    def set_attention_backend(self, backend: AttentionBackend) -> None:
        for layer in self.model.layers:
            layer.self_attn.backend = backend

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.lm_head_op if self.lm_head_op is not None else self.lm_head
        return head(hidden).float()

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy HF-named weights in, with clear errors for missing or misshapen tensors."""
        params = dict(self.named_parameters(remove_duplicate=False))
        if self.config.tie_word_embeddings:
            params.pop("lm_head.weight")
        missing = sorted(set(params) - set(state_dict))
        if missing:
            raise ValueError(f"weights are missing {len(missing)} tensors, e.g. {missing[:3]}")
        with torch.no_grad():
            for name, param in params.items():
                tensor = state_dict[name]
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(f"{name}: expected shape {tuple(param.shape)}, got {tuple(tensor.shape)}")
                param.copy_(tensor)
