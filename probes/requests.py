"""One row per request: its lifecycle times, every token's time, and the latencies derived from them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from engine.observer import RequestEventKind
from probes import schemas
from probes.base import columns_table
from probes.engine_probe import EngineProbe
from probes.run_dir import RunDirectory

if TYPE_CHECKING:
    from engine.observer import RequestEvent

_ARRIVED = RequestEventKind.ARRIVED


@dataclass(slots=True)
class RequestLifecycle:
    """What the probe has seen of one request; times are ``time.time()``, ``None`` until they happen."""

    request_id: str
    arrival_time: float | None = None  # the engine's arrival time (a server may set it at HTTP receipt)
    queued_time: float | None = None  # when the engine put it in its waiting queue
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0


class RequestProbe(EngineProbe):
    """Writes ``requests``: one row per request once it finishes (or, still in flight, at stop).

    Derived columns: ``queue_time_s`` (arrival -> first scheduled), ``ttft_s`` (arrival -> first
    token), ``tpot_s`` (mean gap between output tokens after the first), ``itl_s`` (every gap),
    ``e2e_s`` (arrival -> finish). A request's row is written by the first flush after it
    finishes, so a run that crashes keeps every finished request and loses only those in flight.
    """

    name = "requests"
    schema = schemas.REQUESTS

    def __init__(self, run_dir: RunDirectory) -> None:
        super().__init__(run_dir)
        # NOTE: lifecycles of requests not finished yet; touched only in _to_table, under the write lock.
        self._live: dict[str, RequestLifecycle] = {}

    def on_request_event(self, event: RequestEvent) -> None:
        # NOTE: the engine's thread only appends; lifecycles are assembled at flush. ARRIVED is
        # emitted inside add_request right after the request joins the queue: now is its queued time.
        if event.kind is _ARRIVED:
            self._rows.append((event, time.time()))
        else:
            self._rows.append((event, None))

    def _to_table(self, rows: list[tuple[RequestEvent, float | None]], is_final: bool) -> pa.Table:
        finished = [life for event, queued in rows if (life := self._apply(event, queued)) is not None]
        if is_final:
            finished += self._live.values()
            self._live = {}
        return lifecycles_table(finished)

    def _apply(self, event: RequestEvent, queued_time: float | None) -> RequestLifecycle | None:
        """Fold one event into its request's lifecycle; returns the lifecycle when the event ends it."""
        life = self._live.get(event.request_id)
        if life is None:
            life = self._live[event.request_id] = RequestLifecycle(event.request_id)
        kind = event.kind
        life.num_output_tokens = event.num_output_tokens
        if kind is RequestEventKind.TOKEN:
            # NOTE: the hot path (one event per request per step): nothing else a token changes.
            life.token_times.append(event.time)
            return None
        life.num_prompt_tokens = event.num_prompt_tokens
        life.num_cached_tokens = event.num_cached_tokens
        if kind is RequestEventKind.ARRIVED:
            life.arrival_time = event.time
            life.queued_time = queued_time
        elif kind is RequestEventKind.SCHEDULED:
            if life.first_scheduled_time is None:
                life.first_scheduled_time = event.time
        elif kind is RequestEventKind.PREEMPTED:
            life.num_preemptions += 1
        elif kind is RequestEventKind.FINISHED:
            life.finish_time = event.time
            life.finish_reason = event.finish_reason
            return self._live.pop(event.request_id)
        return None


def lifecycles_table(lifecycles: list[RequestLifecycle]) -> pa.Table:
    """Lifecycles as rows of ``requests``, with the derived latencies."""
    columns: dict[str, list[object]] = {name: [] for name in schemas.REQUESTS.names}
    for life in lifecycles:
        times = life.token_times
        first_token = times[0] if times else None
        arrival = life.arrival_time
        values = {
            "request_id": life.request_id, "arrival_time": arrival, "queued_time": life.queued_time,
            "first_scheduled_time": life.first_scheduled_time, "first_token_time": first_token,
            "finish_time": life.finish_time, "finish_reason": life.finish_reason,
            "is_finished": life.finish_time is not None, "num_prompt_tokens": life.num_prompt_tokens,
            "num_output_tokens": life.num_output_tokens, "num_cached_tokens": life.num_cached_tokens,
            "num_preemptions": life.num_preemptions, "token_times": times,
            "queue_time_s": _since(arrival, life.first_scheduled_time),
            "ttft_s": _since(arrival, first_token),
            "tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
            "itl_s": [b - a for a, b in zip(times, times[1:], strict=False)],
            "e2e_s": _since(arrival, life.finish_time),
        }
        for name, value in values.items():
            columns[name].append(value)
    return columns_table(schemas.REQUESTS, columns)


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start
