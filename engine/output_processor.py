"""Request bookkeeping every engine shares: detokenizing, stop strings, outputs and observer events."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from engine.detokenizer import IncrementalDetokenizer
from engine.observer import EngineObserver, RequestEvent, RequestEventKind
from engine.outputs import RequestOutput, TokenLogprob
from engine.request import Request, RequestId, RequestStatus
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer


def stop_status(request: Request, token_id: int, eos_token_ids: frozenset[int]) -> RequestStatus | None:
    """Whether the token just appended ends the request (stop strings are checked on text, elsewhere)."""
    params = request.sampling_params
    # NOTE: the sampler masks EOS and stop ids below min_tokens; this keeps the rule if a caller did not.
    can_stop = request.num_output_tokens > params.min_tokens
    if can_stop and token_id in params.stop_token_ids:
        request.stop_reason = token_id
        return RequestStatus.FINISHED_STOPPED
    if can_stop and not params.ignore_eos and token_id in eos_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= request.max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


class OutputProcessor:
    """Creates requests, turns each new token into a :class:`RequestOutput`, and tells observers."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.observers: list[EngineObserver] = []
        self._detokenizers: dict[RequestId, IncrementalDetokenizer] = {}
        self._logprobs: dict[RequestId, list[TokenLogprob]] = {}  # requests that asked for logprobs
        self._ids = itertools.count()

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        vocab = self.vocab_size
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        return list(prompt)

    def new_request(self, prompt: str | list[int], params: SamplingParams | None, request_id: str | None,
                    arrival_time: float) -> Request:
        """Validate and create a request (ValueError on bad input) and announce its arrival."""
        params = params or SamplingParams()
        rid = RequestId(request_id if request_id is not None else f"req-{next(self._ids)}")
        if rid in self._detokenizers:
            raise ValueError(f"request id {rid!r} is already in use")
        request = Request(rid, self.tokenize(prompt), params, self.max_model_len, arrival_time=arrival_time)
        self._detokenizers[rid] = IncrementalDetokenizer(self.tokenizer, params.stop,
                                                         params.include_stop_str_in_output,
                                                         params.skip_special_tokens)
        if params.logprobs is not None:
            self._logprobs[rid] = []
        self.emit(request, RequestEventKind.ARRIVED, arrival_time)
        return request

    def add_token(self, request: Request, token_id: int) -> str | None:
        """Detokenize the token just appended; returns the stop string it completed, if any.

        Stop strings count only once ``min_tokens`` tokens are out, as in vLLM.
        """
        can_stop = request.num_output_tokens > request.sampling_params.min_tokens
        hit = self._detokenizers[request.request_id].add_token(token_id, can_stop)
        if hit is not None:
            request.stop_reason = hit
        return hit

    def make_output(self, request: Request, token_id: int, now: float,
                    logprob: TokenLogprob | None = None) -> RequestOutput:
        """The output after this token; call once the request's status is final for this step."""
        detok = self._detokenizers[request.request_id]
        if request.is_finished:
            detok.flush()
        self.emit(request, RequestEventKind.TOKEN, now)
        output = self._output(request, detok.text, new_token_ids=[token_id],
                              new_text=detok.take_delta(request.is_finished))
        logprobs = self._logprobs.get(request.request_id)
        if logprobs is not None and logprob is not None:
            logprobs.append(logprob)
            output.logprobs = list(logprobs)
            output.new_logprobs = [logprob]
        if request.is_finished:
            self.release(request, now)
        return output

    def error_output(self, request: Request, error: str, now: float) -> RequestOutput:
        """The last output of a request the engine failed: what it had produced, and why it stopped."""
        detok = self._detokenizers.get(request.request_id)
        if detok is not None:
            detok.flush()
        output = self._output(request, detok.text if detok is not None else "", error=error)
        self.release(request, now)
        return output

    @staticmethod
    def _output(request: Request, text: str, new_token_ids: list[int] | None = None, new_text: str = "",
                error: str | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
            token_ids=request.output_token_ids, text=text, new_token_ids=new_token_ids or [], new_text=new_text,
            finished=request.is_finished, finish_reason=request.finish_reason, stop_reason=request.stop_reason,
            num_cached_tokens=request.num_cached_tokens, num_preemptions=request.num_preemptions, error=error,
        )

    def release(self, request: Request, now: float) -> None:
        """Forget a finished request and announce it."""
        self._logprobs.pop(request.request_id, None)
        if self._detokenizers.pop(request.request_id, None) is not None:
            self.emit(request, RequestEventKind.FINISHED, now)

    def emit(self, request: Request, kind: RequestEventKind, when: float) -> None:
        if not self.observers:
            return
        event = RequestEvent(request.request_id, kind, when, request.num_prompt_tokens,
                             request.num_output_tokens, request.num_cached_tokens, request.finish_reason)
        for observer in self.observers:
            observer.on_request_event(event)
