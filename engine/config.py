"""The one engine configuration, validated on construction and finalized against a model."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from engine.model.config import LlamaConfig

if TYPE_CHECKING:
    import torch

ExecutionMode = Literal["eager", "optimized"]
AttentionBackendName = Literal["auto", "torch", "cpu", "triton"]
KVLayout = Literal["paged", "contiguous"]
WeightsForm = Literal["dense", "int8", "int4"]
Int4ActBits = Literal[16, 8]

# NOTE: names, not torch dtypes: the command line parses these flags before (or without) importing torch
_DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_KV_CACHE_MB = 256.0
DEFAULT_CHUNKED_BATCHED_TOKENS = 512
DEFAULT_MAX_MODEL_LEN = 2048


def _flag(default: object, help: str, **metadata: object) -> Any:
    """A config field and its command-line flag (``engine.flags`` builds the flags from this metadata).

    ``choices`` lists the allowed values when the type does not (a ``Literal`` does); ``exclusive``
    names a group of flags of which at most one may be given; ``negative`` is the flag that turns a
    default-true boolean off.
    """
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


@dataclass(slots=True)
class EngineConfig:
    """Everything that shapes the engine, passed whole to its components.

    Fields left ``None`` are derived from the model by :meth:`finalize`, the one place
    derived values (context length, token budget, KV block count) are computed.
    """

    model: str = _flag("smollm2-135m", "smollm2-135m (default), dummy:tiny, dummy:smollm2-shape, a .gguf file "
                                       "or an HF directory")
    dtype: str = _flag("float32", "weights, activations and KV cache", choices=_DTYPES)
    seed: int = _flag(0, "seeds the weights of dummy models and sampling")
    max_num_seqs: int = _flag(16, "most sequences in one batch")
    max_num_batched_tokens: int | None = _flag(None, "token budget of one step (default: 512 with chunked prefill, "
                                                     "else max_model_len)")
    max_model_len: int | None = _flag(None, "longest prompt + output (default: the model's context, at most 2048)")
    block_size: int = _flag(16, "tokens per KV block")
    num_kv_blocks: int | None = _flag(None, "KV pool size in blocks", exclusive="kv_pool")
    kv_cache_mb: float | None = _flag(None, "KV pool size in MiB (default 256)", exclusive="kv_pool")
    kv_layout: KVLayout = _flag("paged", "paged blocks, or one max_model_len reservation per sequence")
    enable_prefix_caching: bool = _flag(True, "share the KV blocks of identical prompt prefixes",
                                        negative="--no-prefix-caching")
    enable_chunked_prefill: bool = _flag(True, "split long prompts across steps within the token budget",
                                         negative="--no-chunked-prefill")
    execution: ExecutionMode = _flag("optimized", "eager PyTorch, or fused and prepacked kernels (CUDA graphs on GPU)")
    weights: WeightsForm = _flag("dense", "GEMM weights: dense in --dtype; int8 (one scale per row, torch's kernel, "
                                          "fast with --dtype bfloat16) or int4 (the GGUF's own Q4_1 groups of 32, "
                                          "LM head its Q8_0: multiplied by the C kernel built for this CPU, "
                                          "every all-decode step one fused C call; torch's int4 kernel where the "
                                          "C kernels cannot build). CPU only")
    int4_act_bits: Int4ActBits | None = _flag(None, "with --weights int4 on the C kernel: the Q4_1 projections' "
                                                    "activations quantized per group of 32 to 16 bits, or to 8 "
                                                    "(llama.cpp's Q8_1: about half the kernel's instructions, "
                                                    "each activation within 1/254 of its group's largest). "
                                                    "The Q8_0 LM head always takes 16. Default: 16")
    int4_dense_rows: int | None = _flag(None, "with --weights int4 on the C kernel: steps of at least this many rows "
                                              "(prompt chunks) multiply a dense copy of the weights in --dtype "
                                              "instead of the 4-bit codes; the copy costs 2 bytes per weight in "
                                              "bfloat16 (+210 MB for SmolLM2-135M), none is kept when the value "
                                              "exceeds --max-num-batched-tokens. Default: 32 with --dtype bfloat16 "
                                              "on a CPU with native bfloat16 GEMMs (the crossover measured there), "
                                              "else no copy (float32 dense GEMMs are slower than the kernel)")
    device: str = _flag("auto", "auto (CUDA when present), cpu, cuda or cuda:N")
    attention_backend: AttentionBackendName = _flag("auto", "kernels for attention, KV store, RMSNorm and SiLU: "
                                                            "auto is Triton on GPU and the C decode-attention "
                                                            "kernel (cpu) on CPU when optimized, else torch")
    num_threads: int | None = _flag(None, "torch intra-op threads (default: torch's own)")
    host_overhead_ms: float = _flag(0.0, "calibration knob: burn this many ms of host time in every engine step")

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        _require_positive("max_num_seqs", self.max_num_seqs)
        _require_positive("block_size", self.block_size)
        for name in ("max_num_batched_tokens", "max_model_len", "num_kv_blocks", "num_threads", "int4_dense_rows"):
            value = getattr(self, name)
            if value is not None:
                _require_positive(name, value)
        if self.kv_cache_mb is not None and not self.kv_cache_mb > 0:
            raise ValueError(f"kv_cache_mb must be > 0, got {self.kv_cache_mb!r}")
        if self.num_kv_blocks is not None and self.kv_cache_mb is not None:
            raise ValueError("give either num_kv_blocks or kv_cache_mb, not both")
        if self.kv_layout not in ("paged", "contiguous"):
            raise ValueError(f"kv_layout must be 'paged' or 'contiguous', got {self.kv_layout!r}")
        if self.weights not in ("dense", "int8", "int4"):
            raise ValueError(f"weights must be 'dense', 'int8' or 'int4', got {self.weights!r}")
        for name in ("int4_dense_rows", "int4_act_bits"):
            if getattr(self, name) is not None and self.weights != "int4":
                raise ValueError(f"{name} applies to weights='int4', not {self.weights!r}")
        if self.int4_act_bits not in (None, 8, 16):
            raise ValueError(f"int4_act_bits must be 8 or 16, got {self.int4_act_bits!r}")
        if self.execution not in ("eager", "optimized"):
            raise ValueError(f"execution must be 'eager' or 'optimized', got {self.execution!r}")
        if self.attention_backend not in ("auto", "torch", "cpu", "triton"):
            raise ValueError(f"attention_backend must be 'auto', 'torch', 'cpu' or 'triton', "
                             f"got {self.attention_backend!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.host_overhead_ms < 0:
            raise ValueError(f"host_overhead_ms must be >= 0, got {self.host_overhead_ms!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    @property
    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def is_finalized(self) -> bool:
        return None not in (self.max_model_len, self.max_num_batched_tokens, self.num_kv_blocks)

    @property
    def max_blocks_per_seq(self) -> int:
        assert self.max_model_len is not None, "finalize() the config first"
        return math.ceil(self.max_model_len / self.block_size)

    def finalize(self, model_config: LlamaConfig) -> EngineConfig:
        """Return a copy with every derived field filled in and checked against the model."""
        max_model_len = self.max_model_len or min(model_config.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
        if max_model_len > model_config.max_position_embeddings:
            raise ValueError(
                f"max_model_len={max_model_len} exceeds the model's context of "
                f"{model_config.max_position_embeddings} tokens"
            )
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {max_model_len}")

        budget = self.max_num_batched_tokens
        if budget is None:
            budget = DEFAULT_CHUNKED_BATCHED_TOKENS if self.enable_chunked_prefill else max_model_len
            budget = max(budget, self.max_num_seqs)
        elif not self.enable_chunked_prefill and budget < max_model_len:
            raise ValueError(
                f"without chunked prefill a whole prompt must fit one step: max_num_batched_tokens={budget} "
                f"is below max_model_len={max_model_len}; raise it or enable chunked prefill"
            )

        block_bytes = self.block_size * model_config.kv_bytes_per_token(self.torch_dtype.itemsize)
        num_blocks = self.num_kv_blocks
        if num_blocks is None:
            kv_mb = self.kv_cache_mb if self.kv_cache_mb is not None else DEFAULT_KV_CACHE_MB
            num_blocks = int(kv_mb * 2**20 // block_bytes)
        blocks_per_seq = math.ceil(max_model_len / self.block_size)
        if num_blocks < blocks_per_seq:
            raise ValueError(
                f"KV pool too small for one request: {num_blocks} blocks of {self.block_size} tokens "
                f"({num_blocks * block_bytes / 2**20:.2f} MiB) cannot hold max_model_len={max_model_len} "
                f"tokens ({blocks_per_seq} blocks); give more KV memory or a smaller max_model_len"
            )
        return dataclasses.replace(
            self, max_model_len=max_model_len, max_num_batched_tokens=budget, num_kv_blocks=num_blocks,
            kv_cache_mb=None,
        )


def _require_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
