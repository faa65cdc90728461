"""Owns the model and its KV cache; turns a SchedulerOutput into sampled tokens."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from engine.attention import AttentionMetadata, GatherWorkspace, TorchAttentionBackend
from engine.config import EngineConfig
from engine.cpu_kernels.decode_step import DecodeRows
from engine.cuda_graphs import DecodeGraphs
from engine.model.llama import KVCache, LlamaForCausalLM
from engine.model.ops import TORCH_OPS, ModelOps, triton_ops
from engine.model.projection import ProjectionKind, native_bf16_gemm
from engine.model.weights import ModelWeights
from engine.outputs import TokenLogprob
from engine.request import RequestId
from engine.sampler import Sampler
from engine.scheduler import SchedulerOutput
from engine.weights import LoadedModel

if TYPE_CHECKING:
    from engine.cpu_kernels import CpuKernels
    from engine.cpu_kernels.decode_step import FusedDecodeStep
    from engine.cpu_kernels.huge_pages import HugePageArena

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [S] rows of the flat batch whose logits are sampled
    sampled_request_ids: list[RequestId]


@dataclass(slots=True)
class RunnerOutput:
    sampled: dict[RequestId, int]
    prepare_s: float
    forward_s: float
    sample_s: float
    logprobs: dict[RequestId, TokenLogprob] = field(default_factory=dict)  # requests that asked for them


class ModelRunner:
    """Runs the model for one scheduled batch. It reads the scheduler's output, never its queues."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel, eos_token_ids: frozenset[int] = frozenset()) -> None:
        assert config.is_finalized
        self.config = config
        self.model_config = loaded.config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.device = config.torch_device
        self._warn_if_bf16_is_emulated()
        self.ops = self._model_ops()
        self.attention_backend = self.ops.attention
        self.model = LlamaForCausalLM(loaded.config, self._model_weights(loaded), self.ops).eval()
        self.weight_arena = self._weights_onto_huge_pages()
        self.kv_caches = self._allocate_kv_cache()
        # NOTE: eager keeps the plain framework's per-call allocations; that difference is one of the levers.
        self.gather_workspace = GatherWorkspace() if config.execution == "optimized" else None
        self.sampler = Sampler(config.seed, eos_token_ids)
        self.decode_graphs = self._capture_decode_graphs()
        self.fused_decode = self._fused_decode()

    def _capture_decode_graphs(self) -> DecodeGraphs | None:
        """On GPU with the optimized path and Triton attention, capture decode graphs per bucket."""
        if not (self.device.type == "cuda" and self.config.execution == "optimized"
                and self.attention_backend.name == "triton"):
            return None
        graphs = DecodeGraphs(self.model, self.kv_caches, self.config.max_num_seqs, self.config.max_blocks_per_seq,
                              scratch_slot=self.config.num_kv_blocks * self.config.block_size,  # type: ignore[operator]
                              device=self.device)
        graphs.capture()
        return graphs

    def _weights_onto_huge_pages(self) -> HugePageArena | None:
        """On the optimized CPU path, the C kernel's packed weights moved onto huge pages (a decode step streams them)."""
        if self.config.execution != "optimized" or self.device.type != "cpu":
            return None
        from engine.cpu_kernels.huge_pages import kernel_projections, move_onto_huge_pages

        return move_onto_huge_pages(kernel_projections(self.model))

    def _fused_decode(self) -> FusedDecodeStep | None:
        """On the optimized CPU path with int4 kernel weights: all-decode steps in one C call."""
        if self.config.execution != "optimized" or self.config.weights != "int4" or self.device.type != "cpu":
            return None
        from engine.cpu_kernels import cpu_kernels
        from engine.cpu_kernels.decode_step import FusedDecodeStep, why_not_fused

        kernels, problem = cpu_kernels()
        if kernels is not None:
            problem = why_not_fused(self.model, self.kv_caches)
            if problem is None:
                return FusedDecodeStep(kernels, self.model, self.kv_caches)
        logger.warning("decode steps run layer by layer, not as one fused call: %s", problem)
        return None

    def _warn_if_bf16_is_emulated(self) -> None:
        if self.device.type == "cpu" and self.config.dtype == "bfloat16" and native_bf16_gemm() is None:
            logger.warning("dtype=bfloat16 on a CPU without AVX512-BF16 or AMX: its GEMMs are emulated and may be "
                           "slower than float32")
        if self.config.weights == "int8" and self.config.dtype == "float32":
            logger.warning("weights=int8 with float32 activations runs torch's slow CPU path (slower than dense "
                           "float32); add --dtype bfloat16")

    def _model_weights(self, loaded: LoadedModel) -> ModelWeights:
        """The projection form: quantized when asked; on CPU the optimized path prepacks the dense ones."""
        projection: ProjectionKind = "dense"
        if self.config.weights != "dense":
            projection = self.config.weights
        elif self.config.execution == "optimized" and self.device.type == "cpu":
            projection = "packed"
        kernels = self._quant_kernels() if projection == "int4" else None
        return ModelWeights(loaded.config, loaded.state_dict, self.config.torch_dtype, self.device, projection,
                            loaded.int4_weights, loaded.source, kernels, loaded.int8_weights,
                            self._int4_dense_rows() if kernels is not None else None,
                            self.config.int4_act_bits or 16)

    def _int4_dense_rows(self) -> int | None:
        """Rows from which an int4 step multiplies a dense copy instead of the codes; None: no copy is kept.

        Asked for, or by default where the dense GEMM measured faster for big steps: bfloat16 on a CPU that
        runs it natively. A bound no step reaches (the token budget) keeps no copy.
        """
        from engine.model.kernel_projection import BF16_DENSE_FROM_ROWS

        rows = self.config.int4_dense_rows
        if rows is None and self.config.dtype == "bfloat16" and native_bf16_gemm() is not None:
            rows = BF16_DENSE_FROM_ROWS
        budget = self.config.max_num_batched_tokens
        assert budget is not None
        return rows if rows is not None and rows <= budget else None

    def _quant_kernels(self) -> CpuKernels | None:
        """The C kernels for int4 weights (Q4_1 codes, Q8_0 head); None, logged, where they cannot run."""
        from engine.cpu_kernels import cpu_kernels

        kernels, problem = cpu_kernels()
        if self.device.type != "cpu":
            problem = f"the model runs on {self.device}"
        elif kernels is not None:
            return kernels
        logger.warning("weights=int4 keeps torch's int4 kernel: %s%s", problem,
                       "; with float32 activations it is slower than dense float32, add --dtype bfloat16"
                       if self.config.dtype == "float32" else "")
        return None

    def _model_ops(self) -> ModelOps:
        """Triton kernels (attention, KV store, norms, SiLU) on the optimized GPU path or when asked; else torch."""
        name = self.config.attention_backend
        optimized = self.config.execution == "optimized"
        if name == "auto":
            name = "torch" if not optimized else "triton" if self.device.type == "cuda" else "cpu"
        if name == "torch":
            return TORCH_OPS
        if name == "cpu":
            return self._cpu_ops(required=self.config.attention_backend == "cpu")
        # Imported only here: Triton decides compiled vs interpreted when the kernels are defined.
        from engine.kernels import triton_available

        available, reason = triton_available()
        if not available:
            raise ValueError(f"attention_backend='triton' cannot run here: {reason}")
        return triton_ops()

    def _cpu_ops(self, required: bool) -> ModelOps:
        """The C decode-attention kernel (built here at first use); torch's ops where it cannot run."""
        from engine.cpu_kernels import cpu_kernels

        kernels, problem = cpu_kernels()
        if self.device.type != "cpu":
            problem = f"the model runs on {self.device}"
        elif self.config.dtype not in ("float32", "bfloat16"):
            problem = f"dtype {self.config.dtype} (the kernel has float32 and bfloat16)"
        elif kernels is not None:
            return replace(TORCH_OPS, name="cpu", attention=TorchAttentionBackend("cpu", kernels.decode_attention))
        if required:
            raise ValueError(f"attention_backend='cpu' cannot run here: {problem}")
        logger.warning("the optimized path keeps torch's decode attention: %s", problem)
        return TORCH_OPS

    def _allocate_kv_cache(self) -> list[KVCache]:
        mc = self.model_config
        # NOTE: one block more than the block manager hands out: its slots are scratch for padded
        # CUDA-graph rows, so no request's K/V is ever overwritten.
        shape = (self.config.num_kv_blocks + 1, self.config.block_size, mc.num_kv_heads, mc.head_dim)  # type: ignore[operator]
        dtype, device = self.config.torch_dtype, self.device
        caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                  for _ in range(mc.num_layers)]
        if device.type == "cpu" and self.config.execution == "optimized":
            # NOTE: a large CPU torch.zeros is mapped lazily: each first write into a fresh page (a huge page
            # when the kernel backs it so) faults and zeroes it inside a serving step, several ms per step
            # on a small model. The optimized path faults the whole pool in once, here.
            for key, value in caches:
                key.zero_()
                value.zero_()
        return caches

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the KV pool the block manager hands out (the scratch block excluded)."""
        per_block = self.kv_caches[0][0][0].numel() * self.kv_caches[0][0].element_size()
        return 2 * len(self.kv_caches) * per_block * self.config.num_kv_blocks  # type: ignore[operator]

    def prepare_inputs(self, out: SchedulerOutput) -> ModelInputs:
        block_size = self.config.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        block_tables: list[list[int]] = []
        logits_indices: list[int] = []
        sampled_ids: list[RequestId] = []
        for item in out.scheduled:
            request = item.request
            start = item.start
            end = start + item.num_new_tokens
            input_ids.extend(request.all_token_ids[start:end])
            positions.extend(range(start, end))
            blocks = request.block_ids
            slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(start, end))
            query_lens.append(item.num_new_tokens)
            seq_lens.append(end)
            block_tables.append(blocks)
            if item.samples_token:
                logits_indices.append(len(input_ids) - 1)
                sampled_ids.append(request.request_id)
        device = self.device
        meta = AttentionMetadata.build(slots, block_tables, query_lens, seq_lens, device)
        meta.workspace = self.gather_workspace
        # NOTE: one tensor, three views: each tensor made from a list costs a one-token decode step microseconds
        num_tokens = len(input_ids)
        longs = torch.tensor(input_ids + positions + logits_indices, dtype=torch.int64).to(device, non_blocking=True)
        return ModelInputs(
            input_ids=longs[:num_tokens],
            positions=longs[num_tokens:2 * num_tokens],
            meta=meta,
            logits_indices=longs[2 * num_tokens:],
            sampled_request_ids=sampled_ids,
        )

    def decode_rows(self, out: SchedulerOutput) -> DecodeRows | None:
        """The step as the fused C step reads it, when there is one and every scheduled request decodes and samples
        one token; else None (the general path, :meth:`prepare_inputs`)."""
        if self.fused_decode is None or not out.scheduled:
            return None
        block_size = self.config.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        for item in out.scheduled:
            if item.num_new_tokens != 1 or not item.samples_token:
                return None
            request, at = item.request, item.start
            ids.append(request.all_token_ids[at])
            positions.append(at)
            slots.append(request.block_ids[at // block_size] * block_size + at % block_size)
            tables.append(request.block_ids)
        return DecodeRows.build(ids, positions, slots, [p + 1 for p in positions], tables)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        t0 = time.perf_counter()
        rows = self.decode_rows(out)
        if rows is not None:
            assert self.fused_decode is not None
            ids = [item.request.request_id for item in out.scheduled]
            t1 = time.perf_counter()
            logits = self.fused_decode.logits(rows)
        else:
            inputs = self.prepare_inputs(out)
            ids = inputs.sampled_request_ids
            t1 = time.perf_counter()
            logits = self._forward(inputs)
        t2 = time.perf_counter()
        sampling = [item.request for item in out.scheduled if item.samples_token]
        sampled = self.sampler.sample(logits, ids, [r.sampling_params for r in sampling],
                                      [r.num_output_tokens for r in sampling])
        t3 = time.perf_counter()
        logprobs = {rid: lp for rid, lp in zip(ids, sampled.logprobs, strict=True) if lp is not None}
        return RunnerOutput(dict(zip(ids, sampled.token_ids, strict=True)), t1 - t0, t2 - t1, t3 - t2, logprobs)

    def _forward(self, inputs: ModelInputs) -> torch.Tensor:
        """The sampled rows' float32 logits on the host: a decode graph, the fused step or the model's forward."""
        if self.decode_graphs is not None and not inputs.meta.prefill_ids \
                and self.decode_graphs.can_run(inputs.meta.num_seqs):
            hidden = self.decode_graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        elif self.fused_decode is not None and not inputs.meta.prefill_ids:
            hidden = self.fused_decode.run(inputs.input_ids, inputs.positions, inputs.meta)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        # NOTE: as many sampled rows as rows means every row, in order (each sequence's last row is sampled)
        every_row = inputs.logits_indices.shape[0] == inputs.input_ids.shape[0]
        sampled_rows = hidden if every_row else hidden.index_select(0, inputs.logits_indices)
        # NOTE: .cpu() waits for the device, so forward_s covers the kernels, not just their launch.
        return self.model.compute_logits(sampled_rows).cpu()
