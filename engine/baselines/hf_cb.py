"""HF transformers' own continuous batching (its paged-attention manager) as a baseline engine."""

from __future__ import annotations

import queue
import time

import torch
import transformers
from transformers.generation.continuous_batching import ContinuousBatchingManager

from engine.baselines.hf_model import hf_model_from
from engine.config import EngineConfig
from engine.engine_base import EngineBase, resolve_model
from engine.observer import RequestEventKind, StepStats
from engine.output_processor import stop_status
from engine.outputs import EngineStats, RequestOutput
from engine.request import Request, RequestId, RequestStatus
from engine.sampling_params import SamplingParams
from engine.weights import LoadedModel

# HF CB picks the attention per manager; "sdpa" is what `from_pretrained` (and so `transformers serve`)
# loads by default, and the manager runs it over its paged cache.
HF_CB_ATTENTION = "sdpa"


class HFContinuousBatchingEngine(EngineBase):
    """transformers' ``ContinuousBatchingManager`` (paged KV cache, FIFO scheduler, chunked prefill).

    The manager is built with ``init_continuous_batching`` on exactly the engine's weights and dtype,
    with the engine's KV budget (``num_kv_blocks`` pages of ``block_size`` tokens), batch budget
    (``max_num_batched_tokens``, ``max_num_seqs``) and prefix-caching switch. Instead of starting its
    background thread, :meth:`step` runs one iteration of the manager's own loop body (schedule, forward
    and sample, update) on the caller's thread, so each call is one HF step the observers can count.

    HF CB fixes greedy-or-sampled per manager, so this baseline decodes greedily and refuses requests
    that need what it cannot do per request (sampling, ``min_tokens``, logprobs). Stop rules (EOS,
    stop ids, stop strings, lengths) are the engine's own; a request stopped early is cancelled in HF.
    """

    kind = "hf-cb"

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        loaded = resolve_model(config, loaded)
        super().__init__(config, loaded)
        model = hf_model_from(self.model_config, loaded.state_dict, self.config.torch_dtype)
        model.set_attn_implementation(HF_CB_ATTENTION)
        self.model = model
        cb_config = transformers.ContinuousBatchingConfig(
            page_size=self.config.block_size, num_blocks=self.config.num_kv_blocks,
            max_batch_tokens=self.config.max_num_batched_tokens, max_requests_per_batch=self.config.max_num_seqs,
            allow_block_sharing=self.config.enable_prefix_caching, use_async_batching=False, use_cuda_graph=False,
            seed=self.config.seed,
        )
        generation_config = transformers.GenerationConfig(do_sample=False, eos_token_id=-1)
        self.manager: ContinuousBatchingManager = model.init_continuous_batching(
            generation_config=generation_config, continuous_batching_config=cb_config)
        self.manager.warmup()  # builds the batch processor (and its paged cache) without starting the thread
        self.processor = self.manager.batch_processor
        assert self.processor is not None
        self.requests: dict[RequestId, Request] = {}  # queued or running, by id
        self._num_waiting = 0

    # -- the serving interface ------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> RequestId:
        _check_supported(params or SamplingParams())
        return super().add_request(prompt, params, request_id, arrival_time)

    def _enqueue(self, request: Request) -> None:
        # NOTE: HF stops a request only at max_new_tokens (EOS disabled); the engine's rules decide the rest.
        max_new = min(request.sampling_params.max_tokens, request.max_model_len - request.num_prompt_tokens)
        self.manager.add_request(request.prompt_token_ids, request_id=request.request_id, max_new_tokens=max_new,
                                 streaming=True, eos_token_id=-1)
        self.requests[request.request_id] = request

    def abort(self, request_id: str) -> bool:
        request = self.requests.get(RequestId(request_id))
        if request is None or request.is_finished:
            return False
        request.status = RequestStatus.FINISHED_ABORTED
        self._forget(request)
        self.outputs.release(request, time.time())
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def stats(self) -> EngineStats:
        scheduler = self.processor.scheduler
        used_blocks = self._kv_blocks_held()
        allocated, used = self._kv_slots()
        num_blocks = self.processor.cache.num_blocks
        return EngineStats(
            num_running=len(scheduler.active_requests), num_waiting=self._waiting(),
            num_kv_blocks=num_blocks, num_kv_blocks_used=used_blocks,
            num_kv_blocks_free=max(num_blocks - used_blocks, 0), num_kv_blocks_cached=0, num_preemptions_total=0,
            num_prefix_query_tokens=0, num_prefix_hit_tokens=0, num_steps=self.num_steps,
            num_kv_slots_allocated=allocated, num_kv_slots_used=used,
        )

    # -- one step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        start_time = time.time()
        t0 = time.perf_counter()
        processor = self.processor
        if not processor.prepare_next_batch():  # takes queued requests and cancellations, schedules
            return []
        batch = processor.inputs_and_outputs.requests_in_batch
        num_seqs = len(batch)
        num_decode = sum(1 for f in batch if f.state.status.name == "DECODING")
        num_prefill = sum(f.query_length for f in batch) - num_decode
        for future in batch:
            request = self.requests.get(RequestId(future.state.request_id))
            if request is not None and request.status == RequestStatus.WAITING:
                request.status = RequestStatus.RUNNING
                self.outputs.emit(request, RequestEventKind.SCHEDULED, start_time)
        t1 = time.perf_counter()
        processor._generation_step(self.model)  # forward, logits processing and greedy sampling
        t2 = time.perf_counter()
        processor.update_batch()  # appends each token and routes streaming outputs to the queue
        t3 = time.perf_counter()
        outputs = self._drain(time.time())
        t4 = time.perf_counter()
        self.num_steps += 1
        if self.observers:
            allocated, used = self._kv_slots()
            stats = StepStats(
                step_index=self.num_steps - 1, start_time=start_time, schedule_s=t1 - t0, prepare_s=0.0,
                forward_s=t2 - t1, sample_s=t3 - t2, output_s=t4 - t3, host_overhead_s=0.0, num_seqs=num_seqs,
                num_prefill_tokens=num_prefill, num_decode_tokens=num_decode,
                num_running=len(processor.scheduler.active_requests), num_waiting=self._waiting(),
                num_kv_blocks_used=0, num_kv_blocks_free=0, num_kv_blocks_cached=0,
                num_kv_slots_allocated=allocated, num_kv_slots_used=used, num_preemptions=0,
                num_prefix_hit_tokens=0,
            )
            for observer in self.observers:
                observer.on_step(stats)
        return outputs

    # -- helpers --------------------------------------------------------------------------------
    def _drain(self, now: float) -> list[RequestOutput]:
        """Turn HF's streamed outputs into the engine's, applying the engine's stop rules per token."""
        results = self.manager.output_router.output_queue
        outputs = []
        while True:
            try:
                result = results.get_nowait()
            except queue.Empty:
                return outputs
            request = self.requests.get(RequestId(result.request_id))
            if request is None:
                continue  # already finished or aborted here
            if result.error is not None:
                request.status = RequestStatus.FINISHED_ABORTED
                self._forget(request, finished_in_hf=True)
                outputs.append(self.outputs.error_output(request, f"hf-cb: {result.error}", now))
                continue
            for token in result.generated_tokens[request.num_output_tokens:]:
                request.num_computed_tokens = request.num_tokens
                request.append_output_token(token)
                status = stop_status(request, token, self.eos_token_ids)
                if self.outputs.add_token(request, token) is not None:
                    status = RequestStatus.FINISHED_STOPPED
                if status is None and result.is_finished() and token == result.generated_tokens[-1]:
                    status = RequestStatus.FINISHED_LENGTH  # HF's max_new_tokens is the length rule too
                if status is not None:
                    request.status = status
                    self._forget(request, finished_in_hf=result.is_finished())
                outputs.append(self.outputs.make_output(request, token, now))
                if request.is_finished:
                    break

    def _forget(self, request: Request, finished_in_hf: bool = False) -> None:
        """Drop a finished request here, and cancel it in HF unless HF finished it too."""
        self.requests.pop(request.request_id, None)
        if not finished_in_hf:
            self.manager.cancel_request(request.request_id)  # applied before HF schedules its next batch

    def _waiting(self) -> int:
        return sum(1 for r in self.requests.values() if r.status == RequestStatus.WAITING)

    def _kv_blocks_held(self) -> int:
        """Pages HF's block tables give the running requests (one full-attention table for Llama)."""
        tables = [allocator.block_table for allocator in self.processor.cache.cache_allocators.values()]
        return sum(len(table.get(rid, [])) for table in tables[:1] for rid in self.processor.scheduler.active_requests)

    def _kv_slots(self) -> tuple[int, int]:
        """Token slots in the pages HF gave running requests, and those holding a computed token."""
        active = self.processor.scheduler.active_requests.values()
        return self._kv_blocks_held() * self.config.block_size, sum(s.position_offset for s in active)


def _check_supported(params: SamplingParams) -> None:
    """ValueError (a 400 from the server) for what HF CB cannot do per request."""
    if params.temperature > 0:
        raise ValueError("engine hf-cb decodes greedily only (HF continuous batching fixes sampling per manager); "
                         "send temperature 0")
    if params.min_tokens:
        raise ValueError("engine hf-cb does not support min_tokens (HF CB cannot mask EOS per request)")
    if params.logprobs is not None:
        raise ValueError("engine hf-cb does not return logprobs")
