"""The engine loop: schedule, run the model, apply the results, tell the observers."""

from __future__ import annotations

import itertools
import time

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.model_runner import ModelRunner
from engine.observer import EngineObserver, RequestEvent, RequestEventKind, StepStats
from engine.outputs import EngineStats, RequestOutput
from engine.request import Request, RequestId, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput, TokenUpdate
from engine.weights import LoadedModel, load_model


class LLMEngine:
    """A continuous-batching engine over a paged KV cache. Not thread-safe: one thread drives it."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        if loaded is None:
            loaded = load_model(config.model, config.torch_dtype, config.seed)
        self.config = config.finalize(loaded.config)
        self.model_config = loaded.config
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        eos_ids = frozenset(loaded.config.eos_token_ids) | frozenset(self.tokenizer.eos_token_ids)
        self.scheduler = Scheduler(self.config, eos_ids)
        self.runner = ModelRunner(self.config, loaded)
        self.observers: list[EngineObserver] = []
        self._detokenizers: dict[RequestId, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        self.num_steps = 0

    # -- requests -----------------------------------------------------------------------------
    def add_observer(self, observer: EngineObserver) -> None:
        self.observers.append(observer)

    def remove_observer(self, observer: EngineObserver) -> None:
        self.observers.remove(observer)

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        vocab = self.model_config.vocab_size
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        return list(prompt)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> RequestId:
        """Queue a request; raises ValueError for an empty or over-long prompt."""
        params = params or SamplingParams()
        rid = RequestId(request_id if request_id is not None else f"req-{next(self._ids)}")
        request = Request(rid, self.tokenize(prompt), params, self.config.max_model_len,  # type: ignore[arg-type]
                          arrival_time=arrival_time if arrival_time is not None else time.time())
        self.scheduler.add_request(request)
        self._detokenizers[rid] = IncrementalDetokenizer(self.tokenizer, params.stop,
                                                         params.include_stop_str_in_output)
        self._emit(request, RequestEventKind.ARRIVED, request.arrival_time)
        return rid

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; False if it is unknown or already done."""
        request = self.scheduler.finish_request(RequestId(request_id), RequestStatus.FINISHED_ABORTED)
        if request is None:
            return False
        self._release(request)
        self._emit(request, RequestEventKind.FINISHED, time.time())
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Advance every scheduled request by one iteration; returns outputs that changed."""
        start_time = time.time()
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        t1 = time.perf_counter()
        if sched.is_empty:
            return []
        overhead_s = self._burn_host_overhead()
        result = self.runner.execute(sched)
        t2 = time.perf_counter()
        updates = self.scheduler.update(sched, result.sampled)
        outputs = self._process(sched, updates)
        t3 = time.perf_counter()
        self.num_steps += 1
        if self.observers:
            stats = self._step_stats(sched, start_time, t1 - t0, result.prepare_s, result.forward_s,
                                     result.sample_s, t3 - t2, overhead_s)
            for observer in self.observers:
                observer.on_step(stats)
        return outputs

    def stats(self) -> EngineStats:
        bm = self.scheduler.block_manager
        return EngineStats(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            num_kv_blocks=bm.num_blocks, num_kv_blocks_used=bm.num_used_blocks,
            num_kv_blocks_free=bm.num_free_blocks, num_kv_blocks_cached=bm.num_cached_free_blocks,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            num_prefix_query_tokens=bm.num_prefix_query_tokens, num_prefix_hit_tokens=bm.num_prefix_hit_tokens,
            num_steps=self.num_steps,
        )

    # -- helpers ------------------------------------------------------------------------------
    def _burn_host_overhead(self) -> float:
        if self.config.host_overhead_ms <= 0:
            return 0.0
        start = time.perf_counter()
        deadline = start + self.config.host_overhead_ms / 1000
        # NOTE: a busy loop holding the GIL, like real per-step Python overhead, not a sleep.
        while time.perf_counter() < deadline:
            pass
        return time.perf_counter() - start

    def _process(self, sched: SchedulerOutput, updates: list[TokenUpdate]) -> list[RequestOutput]:
        now = time.time()
        for rid in sched.preempted_ids:
            request = self.scheduler.requests.get(rid)
            if request is not None:
                self._emit(request, RequestEventKind.PREEMPTED, now)
        for rid in sched.newly_scheduled_ids:
            request = self.scheduler.requests.get(rid)
            if request is not None:
                self._emit(request, RequestEventKind.SCHEDULED, now)
        outputs: list[RequestOutput] = []
        for update in updates:
            request = update.request
            assert update.new_token_id is not None
            detok = self._detokenizers[request.request_id]
            hit = detok.add_token(update.new_token_id)
            if hit is not None and not request.is_finished:
                request.stop_reason = hit
                self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
            self._emit(request, RequestEventKind.TOKEN, now)
            outputs.append(RequestOutput(
                request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
                token_ids=request.output_token_ids, text=detok.text, new_token_ids=[update.new_token_id],
                new_text=detok.take_delta(request.is_finished), finished=request.is_finished,
                finish_reason=request.finish_reason, stop_reason=request.stop_reason,
                num_cached_tokens=request.num_cached_tokens, num_preemptions=request.num_preemptions,
            ))
            if request.is_finished:
                self._release(request)
                self._emit(request, RequestEventKind.FINISHED, now)
        return outputs

    def _release(self, request: Request) -> None:
        self._detokenizers.pop(request.request_id, None)
        self.runner.sampler.release(request.request_id)

    def _emit(self, request: Request, kind: RequestEventKind, when: float) -> None:
        if not self.observers:
            return
        event = RequestEvent(request.request_id, kind, when, request.num_prompt_tokens,
                             request.num_output_tokens, request.num_cached_tokens, request.finish_reason)
        for observer in self.observers:
            observer.on_request_event(event)

    def _step_stats(self, sched: SchedulerOutput, start_time: float, schedule_s: float, prepare_s: float,
                    forward_s: float, sample_s: float, output_s: float, overhead_s: float) -> StepStats:
        bm = self.scheduler.block_manager
        running = self.scheduler.running
        allocated = sum(len(r.block_ids) for r in running) * bm.block_size
        used = sum(r.num_computed_tokens for r in running)
        return StepStats(
            step_index=self.num_steps - 1, start_time=start_time, schedule_s=schedule_s, prepare_s=prepare_s,
            forward_s=forward_s, sample_s=sample_s, output_s=output_s, host_overhead_s=overhead_s,
            num_seqs=len(sched.scheduled), num_prefill_tokens=sched.num_prefill_tokens,
            num_decode_tokens=sched.num_decode_tokens, num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting, num_kv_blocks_used=bm.num_used_blocks,
            num_kv_blocks_free=bm.num_free_blocks, num_kv_blocks_cached=bm.num_cached_free_blocks,
            num_kv_slots_allocated=allocated, num_kv_slots_used=used,
            num_preemptions=len(sched.preempted_ids), num_prefix_hit_tokens=sched.num_prefix_hit_tokens,
        )
