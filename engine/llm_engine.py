"""The engine loop: schedule, run the model, apply the results, tell the observers."""

from __future__ import annotations

import dataclasses
import logging
import time

from engine.config import EngineConfig
from engine.engine_base import EngineBase, resolve_model
from engine.model_runner import ModelRunner, RunnerOutput
from engine.observer import RequestEventKind, StepStats
from engine.outputs import EngineStats, RequestOutput, TokenLogprob
from engine.request import Request, RequestId, RequestStatus
from engine.scheduler import ScheduledRequest, Scheduler, SchedulerOutput, TokenUpdate
from engine.weights import LoadedModel

logger = logging.getLogger(__name__)


def burn_host_overhead(milliseconds: float) -> float:
    """Spend ``milliseconds`` of host time; returns the seconds actually spent."""
    if milliseconds <= 0:
        return 0.0
    start = time.perf_counter()
    deadline = start + milliseconds / 1000
    # NOTE: a busy loop holding the GIL, like real per-step Python overhead, not a sleep.
    while time.perf_counter() < deadline:
        pass
    return time.perf_counter() - start


class LLMEngine(EngineBase):
    """A continuous-batching engine over a paged KV cache. Not thread-safe: one thread drives it."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        loaded = resolve_model(config, loaded)
        super().__init__(config, loaded)
        self.scheduler = Scheduler(self.config, self.eos_token_ids)
        self.runner = ModelRunner(self.config, loaded, self.eos_token_ids)

    def _enqueue(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def decode_weight_bytes(self) -> int | None:
        return self.runner.model.decode_weight_bytes()

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; False if it is unknown or already done."""
        request = self.scheduler.finish_request(RequestId(request_id), RequestStatus.FINISHED_ABORTED)
        if request is None:
            return False
        self.runner.sampler.release(request.request_id)
        self.outputs.release(request, time.time())
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
        self._emit_schedule_events(sched, time.time())
        overhead_s = burn_host_overhead(self.config.host_overhead_ms)
        try:
            result = self.runner.execute(sched)
            failed: list[tuple[ScheduledRequest, Exception]] = []
        except Exception as exc:
            result, failed = self._execute_isolated(sched, exc)
        t2 = time.perf_counter()
        outputs = [self._fail(item.request, exc, time.time()) for item, exc in failed]
        if failed:
            failed_ids = {id(item) for item, _ in failed}
            sched = dataclasses.replace(sched, scheduled=[s for s in sched.scheduled if id(s) not in failed_ids])
        updates = self.scheduler.update(sched, result.sampled)
        outputs += self._process(updates, result)
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
        allocated, used = self.scheduler.kv_slot_usage()
        return EngineStats(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            num_kv_blocks=bm.num_blocks, num_kv_blocks_used=bm.num_used_blocks,
            num_kv_blocks_free=bm.num_free_blocks, num_kv_blocks_cached=bm.num_cached_free_blocks,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            num_prefix_query_tokens=bm.num_prefix_query_tokens, num_prefix_hit_tokens=bm.num_prefix_hit_tokens,
            num_steps=self.num_steps, num_kv_slots_allocated=allocated, num_kv_slots_used=used,
        )

    # -- fault isolation ----------------------------------------------------------------------
    def _execute_isolated(self, sched: SchedulerOutput, batch_error: Exception
                          ) -> tuple[RunnerOutput, list[tuple[ScheduledRequest, Exception]]]:
        """The batch's forward raised: rerun each request alone so that only those that raise again fail.

        Nothing has advanced yet (tokens count as computed only in ``Scheduler.update``), so a
        rerun recomputes the same slots; a failed request's blocks are freed without caching them.
        """
        if len(sched.scheduled) == 1:
            return RunnerOutput({}, 0.0, 0.0, 0.0), [(sched.scheduled[0], batch_error)]
        logger.warning("a batch of %d failed (%r); rerunning its requests one by one", len(sched.scheduled),
                       batch_error)
        merged = RunnerOutput({}, 0.0, 0.0, 0.0)
        failed: list[tuple[ScheduledRequest, Exception]] = []
        for item in sched.scheduled:
            try:
                alone = self.runner.execute(SchedulerOutput(scheduled=[item]))
            except Exception as exc:
                failed.append((item, exc))
                continue
            merged.sampled.update(alone.sampled)
            merged.logprobs.update(alone.logprobs)
            merged.prepare_s += alone.prepare_s
            merged.forward_s += alone.forward_s
            merged.sample_s += alone.sample_s
        return merged, failed

    def _fail(self, request: Request, error: Exception, now: float) -> RequestOutput:
        """Finish one request with ``finish_reason="error"``, freeing its blocks; the others go on."""
        logger.error("request %s failed: %r", request.request_id, error)
        if self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_ERROR) is None:
            request.status = RequestStatus.FINISHED_ERROR  # the scheduler had already finished it
        self.runner.sampler.release(request.request_id)
        return self.outputs.error_output(request, f"{type(error).__name__}: {error}", now)

    # -- helpers ------------------------------------------------------------------------------
    def _emit_schedule_events(self, sched: SchedulerOutput, now: float) -> None:
        """Preemptions and admissions, stamped when the scheduler decided them (before the forward)."""
        for rid, kind in [(r, RequestEventKind.PREEMPTED) for r in sched.preempted_ids] + \
                         [(r, RequestEventKind.SCHEDULED) for r in sched.newly_scheduled_ids]:
            request = self.scheduler.requests.get(rid)
            if request is not None:
                self.outputs.emit(request, kind, now)

    def _process(self, updates: list[TokenUpdate], result: RunnerOutput) -> list[RequestOutput]:
        now = time.time()
        outputs: list[RequestOutput] = []
        for update in updates:
            try:
                outputs.append(self._process_one(update, result.logprobs.get(update.request.request_id), now))
            except Exception as exc:  # e.g. detokenizing this request's token: it fails alone
                outputs.append(self._fail(update.request, exc, now))
        return outputs

    def _process_one(self, update: TokenUpdate, logprob: TokenLogprob | None, now: float) -> RequestOutput:
        request = update.request
        assert update.new_token_id is not None
        if self.outputs.add_token(request, update.new_token_id) is not None:
            if request.is_finished:  # the same token also hit a length limit: the stop string wins
                request.status = RequestStatus.FINISHED_STOPPED
            else:
                self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
        if request.is_finished:
            self.runner.sampler.release(request.request_id)
        return self.outputs.make_output(request, update.new_token_id, now, logprob)

    def _step_stats(self, sched: SchedulerOutput, start_time: float, schedule_s: float, prepare_s: float,
                    forward_s: float, sample_s: float, output_s: float, overhead_s: float) -> StepStats:
        bm = self.scheduler.block_manager
        allocated, used = self.scheduler.kv_slot_usage()
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
