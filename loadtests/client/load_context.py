"""What a Locust worker process knows about its run, and how it sends, times and reports one request.

Built at ``test_start`` from the ``--ss-*`` options and the plan (see :mod:`loadtests.locustfile`);
holds the plan, this worker's share of it, the journal and the clock. Stdlib and Locust only: no torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadtests.client.point_control import PointControl
from loadtests.client.records import ClientRecord, Clock, Journal
from loadtests.client.sse import StreamTimer
from loadtests.client.stream_client import StreamClient, StreamResponse
from loadtests.config import CONTROL_SLACK_S, longest_warmup_s
from loadtests.plan import PlannedRequest
from loadtests.workloads.arrival import OpenLoopArrivals

API_KEY_ENV = "SERVESCOPE_API_KEY"
API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Locust row names: the HTTP row is the endpoint path; these are the per-token rows beside it.
LLM_REQUEST_TYPE = "LLM"
TTFT_ROW, ITL_ROW, TPOT_ROW = "TTFT", "ITL", "TPOT"
# One entry per output token, so the row's requests/s column reads output tokens/s (its times are 0).
OUTPUT_TOKENS_ROW = "output tokens/s"
# Requests sent during the warm-up are reported under their own names, so Locust's rows for the
# endpoint and for TTFT/ITL/TPOT hold measured requests only.
WARMUP_SUFFIX = " [warm-up]"
# A request sent again because its pooled connection closed before any answer (loadtests.client.stream_client).
RETRY_REQUEST_TYPE, RETRY_ROW = "RETRY", "pooled connection closed before any answer: sent again"

RequestEvent = Callable[..., Any]  # Locust's events.request.fire
# After a failed request the user waits before its next one, doubling per failure in a row (a dead or
# refusing server must not see thousands of connections a second); a success resets it.
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 2.0


@dataclass(slots=True)
class LoadContext:
    """One worker's view of the run; ``start_time`` is when its test started (its clock)."""

    plan: list[PlannedRequest]
    journal: Journal
    model: str
    api: str
    worker_index: int
    num_workers: int
    warmup_s: float
    duration_s: float
    ignore_eos: bool
    arrivals: OpenLoopArrivals | None  # None: closed loop
    seed: int
    read_timeout_s: float
    stop_timeout_s: float
    is_trace: bool = False  # send each plan item once at its arrival_s (TraceUser)
    # NOTE: a controlled point (loadtests.client.point_control) learns its window while it runs: warmup_s and
    # duration_s are then only the caps its controller keeps to, and CONTROL_SLACK_S bounds a lost one.
    is_controlled: bool = False
    measure_from: float | None = None  # controlled: requests sent from then on are measured
    stop_at: float | None = None  # controlled: users send nothing from then on
    clock: Clock = field(default_factory=Clock)
    start_time: float = 0.0
    num_sent: int = 0  # plan items taken (a chat session takes all its turns at once)
    num_started: int = 0  # requests sent: journaled, or still in flight
    num_active_users: int = 0
    num_failures_in_a_row: int = 0
    num_chunks: int = 0  # content chunks received so far, in flight or done (the live token rate)
    num_decoding: int = 0  # requests in flight past their first content chunk
    # NOTE: called by the worker's last user when the load reaches its deadline (see loadtests.locustfile).
    on_load_ended: Callable[[], None] = field(default=lambda: None)
    sessions: list[list[int]] = field(init=False)  # chat sessions' plan indices (see next_session)
    _first_rng: random.Random = field(init=False, repr=False)  # first_share's draws
    num_sessions_taken: int = 0

    def __post_init__(self) -> None:
        self.sessions = _sessions(self.plan)
        self._first_rng = random.Random(f"{self.seed}:{self.worker_index}:first")
        if not 0 <= self.worker_index < self.num_workers:
            raise ValueError(f"worker index {self.worker_index} is not below the number of workers "
                             f"{self.num_workers}; pass --ss-num-workers")
        self.start_time = self.clock.now()

    @classmethod
    def from_options(cls, options: Any, worker_index: int, plan: list[PlannedRequest], journal: Journal) -> LoadContext:
        arrivals = (OpenLoopArrivals(options.ss_rate, options.ss_burstiness, options.ss_burst_size or 1)
                    .for_worker(options.ss_num_workers) if options.ss_rate > 0 else None)
        # NOTE: no --ss-duration (a plain Locust run): users send until Locust stops them.
        duration_s = options.ss_duration if options.ss_duration is not None else math.inf
        return cls(plan=plan, journal=journal, model=options.ss_model,
                   api=options.ss_api, worker_index=worker_index, num_workers=options.ss_num_workers,
                   warmup_s=options.ss_warmup, duration_s=duration_s, ignore_eos=bool(options.ss_ignore_eos),
                   arrivals=arrivals, seed=options.ss_seed, read_timeout_s=options.ss_read_timeout,
                   stop_timeout_s=options.stop_timeout or 0.0, is_trace=bool(options.ss_trace),
                   is_controlled=bool(options.ss_controlled))

    @property
    def worker(self) -> str:
        return worker_name(self.worker_index)

    @property
    def path(self) -> str:
        return API_PATHS[self.api]

    @property
    def deadline(self) -> float:
        """When users stop sending: the end of warm-up + duration, or a controlled point's ``stop_at``."""
        if not self.is_controlled:
            return self.start_time + self.warmup_s + self.duration_s
        warmup = longest_warmup_s(self.warmup_s, True, self.arrivals is None and not self.is_trace)
        bound = self.start_time + warmup + self.duration_s + CONTROL_SLACK_S
        return bound if self.stop_at is None else min(self.stop_at, bound)

    @property
    def num_trace_items(self) -> int:
        """How many plan items this worker sends in a trace replay (each once)."""
        return len(range(self.worker_index, len(self.plan), self.num_workers))

    @property
    def ends_itself(self) -> bool:
        """Whether users stop at a deadline (an orchestrated run), not only when Locust stops them."""
        return math.isfinite(self.deadline)

    def is_warmup(self, t: float) -> bool:
        if self.is_controlled:
            return self.measure_from is None or t < self.measure_from
        return t < self.start_time + self.warmup_s

    def apply(self, control: PointControl) -> None:
        """Follow the window a controlled point's orchestrator decided (loadtests.client.point_control)."""
        self.measure_from, self.stop_at = control.measure_from, control.stop_at

    def first_share(self) -> float | None:
        """The share of its output a closed-loop user's first request asks for in a controlled point, drawn
        uniformly (seeded); None otherwise.

        NOTE: users that all start at once would otherwise move in step for several requests (same
        lengths, ends on the same step, prefills all at once: multi-second stalls, then bursts), and a
        window's throughput would depend on where it falls in that cycle. Cut at random, the first
        requests end spread over a request's lifetime; every later request is sent as planned, and the
        first ones are in the warm-up, which lasts until as many requests are done as there are users.
        """
        if not self.is_controlled or self.arrivals is not None or self.is_trace:
            return None
        return self._first_rng.random()

    def progress(self) -> dict[str, int]:
        """What the live token rate and steadiness are read from (loadtests.point_stop), cumulative or now."""
        num_done = self.journal.num_records
        return {"chunks": self.num_chunks, "in_flight": self.num_started - num_done, "decoding": self.num_decoding,
                "done": num_done}

    def next_item(self) -> tuple[int, PlannedRequest]:
        """This worker's next request: ``(seq, planned request)``.

        NOTE: worker i of W takes plan items i, i + W, i + 2W, ... (cycling), so workers never send
        the same item until the plan wraps. Greenlets never interleave inside this method.
        """
        seq = self.num_sent
        self.num_sent += 1
        return seq, self.plan[(self.worker_index + seq * self.num_workers) % len(self.plan)]

    def next_session(self) -> list[tuple[int, PlannedRequest]]:
        """This worker's next chat session: ``(seq, item)`` per turn, in turn order.

        NOTE: worker i of W takes sessions i, i + W, ... (cycling), as :meth:`next_item` takes items.
        """
        if not self.sessions:
            raise ValueError("the plan has no chat sessions (its items have no turn)")
        n = self.num_sessions_taken
        self.num_sessions_taken += 1
        indices = self.sessions[(self.worker_index + n * self.num_workers) % len(self.sessions)]
        out = []
        for index in indices:
            out.append((self.num_sent, self.plan[index]))
            self.num_sent += 1
        return out

    def body(self, item: PlannedRequest, messages: list[dict[str, str]] | None = None) -> dict[str, Any]:
        # NOTE: token ids (a trace's exact lengths) go to the completions API only; chat sends the text.
        prompt = item.prompt if item.prompt_token_ids is None or self.api == "chat" else item.prompt_token_ids
        return request_body(self.model, self.api, prompt, item.max_tokens, self.ignore_eos, messages)

    def backoff_s(self, is_ok: bool) -> float:
        """How long to wait before the next request, given how the last one went (see ``BACKOFF_*``)."""
        self.num_failures_in_a_row = 0 if is_ok else self.num_failures_in_a_row + 1
        if is_ok:
            return 0.0
        return min(BACKOFF_FIRST_S * 2 ** (self.num_failures_in_a_row - 1), BACKOFF_MAX_S)

    def headers(self) -> dict[str, str]:
        api_key = os.environ.get(API_KEY_ENV)
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def user_started(self) -> None:
        self.num_active_users += 1

    def user_finished(self) -> bool:
        """Count a user out; True when it was the last one (users stop at the deadline, or misused)."""
        self.num_active_users -= 1
        return self.num_active_users == 0

    def close(self) -> None:
        self.journal.close()


def worker_name(worker_index: int) -> str:
    """``w0``, ``w1``, ...: the name a worker's client rows and health samples carry."""
    return f"w{worker_index}"


def request_body(model: str, api: str, prompt: str | list[int], max_tokens: int, ignore_eos: bool,
                 messages: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The streaming request every load sends (and the probe before it): chat ``messages``, else ``prompt``."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension, also served by ours, SGLang and llama.cpp's
    if api == "chat":
        body["messages"] = messages if messages is not None else [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def send_request(client: StreamClient, ctx: LoadContext, fire: RequestEvent, scheduled_time: float | None = None,
                 planned: tuple[int, PlannedRequest] | None = None,
                 messages: list[dict[str, str]] | None = None, output_share: float | None = None) -> str | None:
    """Send the next planned request (or ``planned``: ``(seq, item)``), stream it, journal its row, and
    report it to Locust; returns the streamed text when ``messages`` (a chat history) was given
    and the request succeeded, else None. ``output_share``: ask for that share of the item's output
    tokens only (a closed-loop user's first request of a controlled point, :meth:`LoadContext.first_share`).

    The HTTP row's time is the whole exchange (send to finish chunk). A request the client sent
    again because its pooled connection closed before any answer (loadtests.client.stream_client) is
    reported once more, as a ``RETRY`` row of its own, and its client row says so.
    """
    seq, item = planned if planned is not None else ctx.next_item()
    if output_share is not None:
        item = dataclasses.replace(item, max_tokens=max(1, math.ceil(item.max_tokens * output_share)))
    # NOTE: gevent's timers run on the event loop's cached clock and can fire a fraction of a
    # millisecond before the wall-clock time they were set for; a scheduled request is never sent early.
    while scheduled_time is not None and (early_s := scheduled_time - ctx.clock.now()) > 0:
        time.sleep(early_s)
    send = ctx.clock.now()
    ctx.num_started += 1
    record = ClientRecord(worker=ctx.worker, seq=seq, plan_index=item.index, group=item.group,
                          is_warmup=ctx.is_warmup(send), send_time=send, scheduled_time=scheduled_time,
                          planned_prompt_tokens=item.num_prompt_tokens, max_tokens=item.max_tokens)
    suffix = WARMUP_SUFFIX if record.is_warmup else ""
    text: str | None = None
    is_cut_short = False
    body = json.dumps(ctx.body(item, messages)).encode()
    try:
        try:
            with client.post_stream(ctx.path, body, ctx.headers(), ctx.read_timeout_s) as response:
                record.first_byte_time = ctx.clock.now()
                if response.retry_error is not None:
                    record.num_retries, record.retry_error = 1, response.retry_error
                text = _read_response(response, ctx, record, keep_text=messages is not None)
        except Exception as exc:  # noqa: BLE001 - no answer, or a broken stream: this request's failure, not the user's
            if record.error is None:
                record.error = f"{type(exc).__name__}: {exc}"
    except BaseException as exc:
        # NOTE: GreenletExit when the run's stop timeout kills the user mid-request: journaled as a
        # failure when the run ends itself; a plain run's users end only when Locust stops them, and
        # the request Locust cut short is left out, as Locust leaves it out of its own stats.
        is_cut_short = not ctx.ends_itself
        if record.error is None:
            record.error = f"cancelled: {type(exc).__name__}"
        raise
    finally:
        if is_cut_short:
            ctx.num_started -= 1  # NOTE: num_started counts journaled requests and those in flight only
        else:
            ctx.journal.write(record)
    report_http_row(fire, ctx.path + suffix, record, ctx.clock.now())
    wait_s = ctx.backoff_s(record.is_ok)
    if record.is_ok:
        report_token_rows(fire, record, suffix)
        return text
    # NOTE: Locust monkey-patches time.sleep to yield to the other users.
    time.sleep(min(wait_s, max(ctx.deadline - ctx.clock.now(), 0.0)))
    return None


def _read_response(response: StreamResponse, ctx: LoadContext, record: ClientRecord,
                   keep_text: bool = False) -> str | None:
    """Fill ``record`` from the response; the streamed text when ``keep_text``."""
    record.status_code = response.status_code
    if record.status_code != 200:
        record.error = f"HTTP {record.status_code}: {response.text()[:300]}"
        return None
    timer = StreamTimer(ctx.api, keep_text)
    num_chunks = 0
    try:
        for raw in response.iter_lines():
            timer.feed(raw.decode("utf-8", errors="replace"), ctx.clock.now())
            if len(timer.timing.token_times) > num_chunks:
                if num_chunks == 0:
                    ctx.num_decoding += 1
                ctx.num_chunks += len(timer.timing.token_times) - num_chunks
                num_chunks = len(timer.timing.token_times)
    finally:
        if num_chunks:
            ctx.num_decoding -= 1
    timing = timer.finish()
    record.request_id = timing.request_id
    record.first_token_time = timing.first_token_time
    record.token_times = timing.token_times
    record.end_time = timing.end_time
    record.finish_reason = timing.finish_reason
    record.num_prompt_tokens = timing.num_prompt_tokens
    record.num_output_tokens = timing.num_output_tokens
    record.num_cached_tokens = timing.num_cached_tokens
    record.has_usage = timing.has_usage
    record.server_prompt_s = timing.server_prompt_s
    record.server_decode_s = timing.server_decode_s
    record.server_decode_tokens = timing.server_decode_tokens
    record.error = timing.error
    return timing.text if keep_text else None


def report_http_row(fire: RequestEvent, name: str, record: ClientRecord, now: float) -> None:
    """The request's Locust row (its time: send to finish chunk), and a ``RETRY`` row when it was sent twice."""
    if record.num_retries:
        fire(request_type=RETRY_REQUEST_TYPE, name=RETRY_ROW, response_time=0.0, response_length=0, exception=None,
             context={})
    fire(request_type="POST", name=name, response_time=((record.end_time or now) - record.send_time) * 1000,
         response_length=record.num_output_tokens or 0,
         exception=None if record.is_ok else RequestFailed(record.error or f"HTTP {record.status_code}"), context={})


class RequestFailed(Exception):
    """A failed request as Locust's failure table shows it: its error text."""


def _sessions(plan: list[PlannedRequest]) -> list[list[int]]:
    """Plan indices of each chat session (items with a turn, grouped by ``group``), turns in order."""
    sessions: dict[str, list[tuple[int, int]]] = {}
    for index, item in enumerate(plan):
        if item.turn is not None:
            sessions.setdefault(item.group, []).append((item.turn, index))
    return [[index for _, index in sorted(turns)] for turns in sessions.values()]


def report_token_rows(fire: RequestEvent, record: ClientRecord, suffix: str = "") -> None:
    """TTFT (one per request), ITL (one per gap between content chunks) and TPOT as Locust rows, in ms;
    and one ``output tokens/s`` entry per output token (see :data:`OUTPUT_TOKENS_ROW`)."""

    def row(name: str, seconds: float, length: int) -> None:
        fire(request_type=LLM_REQUEST_TYPE, name=name + suffix, response_time=seconds * 1000.0,
             response_length=length, exception=None, context={})

    ttft = record.ttft_s
    if ttft is not None:
        row(TTFT_ROW, ttft, record.num_prompt_tokens or 0)
    for gap in record.itl_s:
        row(ITL_ROW, gap, 1)
    tpot = record.tpot_s
    if tpot is not None:
        row(TPOT_ROW, tpot, record.num_output_tokens or 0)
    for _ in range(record.num_output_tokens or 0):
        row(OUTPUT_TOKENS_ROW, 0.0, 1)
