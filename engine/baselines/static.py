"""Raw-framework baselines on HF transformers: static padded batches, and one request at a time."""

from __future__ import annotations

import time
from collections import deque

import torch
import transformers

from engine.baselines.hf_model import cache_kwarg, hf_model_from, returned_cache
from engine.config import EngineConfig
from engine.engine_base import EngineBase, resolve_model
from engine.llm_engine import burn_host_overhead
from engine.observer import RequestEventKind, StepStats
from engine.output_processor import stop_status
from engine.outputs import EngineStats, RequestOutput
from engine.request import Request, RequestStatus
from engine.sampler import Sampler
from engine.weights import LoadedModel


class StaticBatchEngine(EngineBase):
    """Padded static batching through HF's ``LlamaForCausalLM`` and its contiguous KV cache.

    Up to ``max_num_seqs`` waiting requests (fewer when the KV budget cannot reserve
    ``max_model_len`` for each) are left-padded into one batch that runs until its
    longest member finishes; finished rows keep occupying the batch (their compute and cache
    are wasted) and nobody joins until the batch is done. This is the decode loop of HF
    ``generate`` unrolled one token per step, so a server can stream it; sampling and stop rules
    are the engine's own, so outputs are comparable token for token.
    """

    kind = "static"

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None,
                 max_batch_size: int | None = None) -> None:
        loaded = resolve_model(config, loaded)
        super().__init__(config, loaded)
        # NOTE: a static server reserves max_model_len of KV per row, so the same KV budget as the
        # paged engine (num_kv_blocks * block_size token slots) caps its batch.
        slots = self.config.num_kv_blocks * self.config.block_size  # type: ignore[operator]
        self.max_batch_size = min(max_batch_size or self.config.max_num_seqs,
                                  max(1, slots // self.config.max_model_len))  # type: ignore[operator]
        self.model: transformers.LlamaForCausalLM = hf_model_from(self.model_config, loaded.state_dict,
                                                                  self.config.torch_dtype)
        self._cache_arg = cache_kwarg(self.model)
        self.sampler = Sampler(self.config.seed, self.eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.batch: list[Request] = []
        self._cache: object | None = None
        self._attention_mask: torch.Tensor | None = None  # [B, L]
        self._positions: torch.Tensor | None = None  # [B] position of each row's last token

    # -- the serving interface ------------------------------------------------------------------
    def _enqueue(self, request: Request) -> None:
        self.waiting.append(request)

    def abort(self, request_id: str) -> bool:
        for request in [*self.waiting, *self.batch]:
            if request.request_id == request_id and not request.is_finished:
                if request in self.waiting:
                    self.waiting.remove(request)
                request.status = RequestStatus.FINISHED_ABORTED  # a batch row keeps computing
                self.sampler.release(request.request_id)
                self.outputs.release(request, time.time())
                return True
        return False

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or any(not r.is_finished for r in self.batch)

    def stats(self) -> EngineStats:
        allocated, used = self._kv_slots()
        return EngineStats(
            num_running=sum(not r.is_finished for r in self.batch), num_waiting=len(self.waiting),
            num_kv_blocks=0, num_kv_blocks_used=0, num_kv_blocks_free=0, num_kv_blocks_cached=0,
            num_preemptions_total=0, num_prefix_query_tokens=0, num_prefix_hit_tokens=0,
            num_steps=self.num_steps, num_kv_slots_allocated=allocated, num_kv_slots_used=used,
        )

    # -- one step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        start_time = time.time()
        t0 = time.perf_counter()
        if self.batch and all(r.is_finished for r in self.batch):
            self._end_batch()  # everything in it was aborted
        if not self.batch:
            if not self.waiting:
                return []
            input_ids, num_prefill = self._start_batch(start_time)
        else:
            assert self._attention_mask is not None and self._positions is not None
            input_ids = torch.tensor([[r.all_token_ids[-1]] for r in self.batch])
            self._attention_mask = torch.cat(
                [self._attention_mask, torch.ones((len(self.batch), 1), dtype=torch.int64)], dim=1)
            self._positions = self._positions + 1
            num_prefill = 0
        t1 = time.perf_counter()
        overhead_s = burn_host_overhead(self.config.host_overhead_ms)
        assert self._attention_mask is not None and self._positions is not None
        position_ids = self._positions.unsqueeze(1) if num_prefill == 0 else self._prefill_position_ids()
        t2 = time.perf_counter()
        out = self.model(input_ids=input_ids, attention_mask=self._attention_mask, position_ids=position_ids,
                         use_cache=True, **{self._cache_arg: self._cache})
        self._cache = returned_cache(out)
        logits = out.logits[:, -1].float()
        t3 = time.perf_counter()
        active = [i for i, r in enumerate(self.batch) if not r.is_finished]
        rows = [self.batch[i] for i in active]
        sampled = self.sampler.sample(logits[active], [r.request_id for r in rows], [r.sampling_params for r in rows],
                                      [r.num_output_tokens for r in rows])
        t4 = time.perf_counter()
        now = time.time()
        outputs = []
        for row, token, logprob in zip(active, sampled.token_ids, sampled.logprobs, strict=True):
            request = self.batch[row]
            request.num_computed_tokens = request.num_tokens
            request.append_output_token(token)
            status = stop_status(request, token, self.eos_token_ids)
            if self.outputs.add_token(request, token) is not None:
                status = RequestStatus.FINISHED_STOPPED
            if status is not None:
                request.status = status
                self.sampler.release(request.request_id)
            outputs.append(self.outputs.make_output(request, token, now, logprob))
        if all(r.is_finished for r in self.batch):
            self._end_batch()
        t5 = time.perf_counter()
        self.num_steps += 1
        if self.observers:
            self._report_step(start_time, t1 - t0, t2 - t1 - overhead_s, t3 - t2, t4 - t3, t5 - t4, overhead_s,
                              len(active), num_prefill, 0 if num_prefill else len(active))
        return outputs

    # -- helpers --------------------------------------------------------------------------------
    def _start_batch(self, now: float) -> tuple[torch.Tensor, int]:
        while self.waiting and len(self.batch) < self.max_batch_size:
            request = self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.batch.append(request)
            self.outputs.emit(request, RequestEventKind.SCHEDULED, now)
        width = max(r.num_tokens for r in self.batch)
        input_ids = torch.zeros((len(self.batch), width), dtype=torch.int64)
        mask = torch.zeros((len(self.batch), width), dtype=torch.int64)
        for row, request in enumerate(self.batch):
            n = request.num_tokens
            input_ids[row, width - n:] = torch.tensor(request.all_token_ids)
            mask[row, width - n:] = 1
        self._attention_mask = mask
        self._positions = mask.sum(dim=1) - 1
        self._cache = None
        return input_ids, int(mask.sum())

    def _prefill_position_ids(self) -> torch.Tensor:
        assert self._attention_mask is not None
        return (self._attention_mask.cumsum(dim=1) - 1).clamp(min=0)

    def _end_batch(self) -> None:
        self.batch = []
        self._cache = None
        self._attention_mask = None
        self._positions = None

    def _kv_slots(self) -> tuple[int, int]:
        """HF's cache holds every row at the padded length, finished rows included."""
        if not self.batch or self._attention_mask is None:
            return 0, 0
        allocated = self._attention_mask.numel()
        used = sum(r.num_computed_tokens for r in self.batch if not r.is_finished)
        return allocated, used

    def _report_step(self, start_time: float, schedule_s: float, prepare_s: float, forward_s: float,
                     sample_s: float, output_s: float, overhead_s: float, num_seqs: int, num_prefill: int,
                     num_decode: int) -> None:
        allocated, used = self._kv_slots()  # what the batch holds going into the next step
        stats = StepStats(
            step_index=self.num_steps - 1, start_time=start_time, schedule_s=schedule_s, prepare_s=prepare_s,
            forward_s=forward_s, sample_s=sample_s, output_s=output_s, host_overhead_s=overhead_s,
            num_seqs=num_seqs, num_prefill_tokens=num_prefill, num_decode_tokens=num_decode,
            num_running=sum(not r.is_finished for r in self.batch), num_waiting=len(self.waiting),
            num_kv_blocks_used=0, num_kv_blocks_free=0, num_kv_blocks_cached=0,
            num_kv_slots_allocated=allocated, num_kv_slots_used=used, num_preemptions=0, num_prefix_hit_tokens=0,
        )
        for observer in self.observers:
            observer.on_step(stats)


class NaiveEngine(StaticBatchEngine):
    """One request at a time through HF ``LlamaForCausalLM``: what a raw-framework server does."""

    kind = "naive"

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        super().__init__(config, loaded, max_batch_size=1)
