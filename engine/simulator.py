"""The engine's own scheduler and block manager on a simulated clock, with a step-cost function for the model.

Nothing here re-implements admission: each simulated step is :meth:`Scheduler.schedule` and
:meth:`Scheduler.update` on the real :class:`~engine.scheduler.Scheduler` (and so the real
:class:`~engine.block_manager.BlockManager`), with every sampled token a placeholder and the step's
duration given by ``step_cost`` instead of a model forward. Requests arrive open loop (each at its
own time) or closed loop (``users`` clients, each sending its next request when the last one ends).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.request import Request, RequestId
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler

# The token every simulated sample produces; no EOS exists in the simulation, so only lengths end requests.
PLACEHOLDER_TOKEN = 0
MAX_STEPS = 2_000_000


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request to replay: its prompt tokens, how many tokens it generates, and (open loop) when it arrives."""

    prompt_token_ids: list[int]
    num_output_tokens: int
    arrival_s: float | None = None


@dataclass(frozen=True, slots=True)
class SimStep:
    """What one simulated step did: the inputs of the step cost."""

    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_context_tokens: int  # computed tokens of the running requests after the step (their KV slots in use)


@dataclass(slots=True)
class SimOutcome:
    """One replayed request: when it was sent, got its first token and finished (simulated seconds)."""

    index: int  # position in the request list
    send_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    first_token_s: float | None = None
    end_s: float | None = None
    num_preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.send_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.send_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_s is None or self.end_s is None or self.num_output_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.num_output_tokens - 1)


@dataclass(slots=True)
class SimRun:
    outcomes: list[SimOutcome]
    steps: list[SimStep] = field(default_factory=list)
    token_times: list[tuple[float, int]] = field(default_factory=list)  # (step end, tokens it sampled) per step
    busy_s: float = 0.0
    end_s: float = 0.0
    is_truncated: bool = False  # stopped by the step or time limit before every request finished


def simulate(config: EngineConfig, requests: Sequence[SimRequest], step_cost: Callable[[SimStep], float], *,
             users: int | None = None, stop_sending_s: float, gap_s: float = 0.0, drain_s: float = 600.0,
             keep_steps: bool = False) -> SimRun:
    """Replay ``requests`` through the real scheduler under ``config``.

    Open loop (``users`` None): request *i* arrives at its ``arrival_s``; those after ``stop_sending_s``
    are never sent. Closed loop: ``users`` clients start at 0 and take the requests in order (cycling
    through the list when it runs out), each sending ``gap_s`` after its last one ended, until
    ``stop_sending_s``. Every sent request then runs to its end, within ``drain_s`` more seconds.
    """
    if not requests:
        raise ValueError("nothing to replay: the request list is empty")
    if users is not None and users < 1:
        raise ValueError(f"users must be >= 1, got {users}")
    config = config if config.is_finalized else _unfinalized(config)
    scheduler = Scheduler(config, eos_token_ids=frozenset())
    max_model_len: int = config.max_model_len  # type: ignore[assignment]
    arrivals: list[tuple[float, int]] = []  # (time, outcome index), a heap
    outcomes: list[SimOutcome] = []
    live: dict[RequestId, SimOutcome] = {}
    source = itertools.cycle(range(len(requests)))

    def send(at: float, index: int) -> None:
        item = requests[index]
        outcome = SimOutcome(index=index, send_s=at, num_prompt_tokens=len(item.prompt_token_ids),
                             num_output_tokens=item.num_output_tokens)
        outcomes.append(outcome)
        heapq.heappush(arrivals, (at, len(outcomes) - 1))

    if users is None:
        for index, item in enumerate(requests):
            if item.arrival_s is None:
                raise ValueError(f"open-loop replay: request {index} has no arrival time")
            if item.arrival_s <= stop_sending_s:
                send(item.arrival_s, index)
    else:
        for _ in range(users):
            send(0.0, next(source))

    run = SimRun(outcomes)
    clock = 0.0
    deadline = stop_sending_s + drain_s
    for _ in range(MAX_STEPS):
        while arrivals and arrivals[0][0] <= clock:
            _, position = heapq.heappop(arrivals)
            outcome = outcomes[position]
            item = requests[outcome.index]
            request = _request(position, item, max_model_len, outcome.send_s)
            scheduler.add_request(request)
            live[request.request_id] = outcome
        if not scheduler.has_unfinished():
            if not arrivals:
                break
            clock = arrivals[0][0]
            continue
        if clock > deadline:
            run.is_truncated = True
            break
        out = scheduler.schedule()
        if out.is_empty:
            raise RuntimeError("the scheduler admits nothing and runs nothing: the KV pool cannot hold one request")
        for request_id in out.preempted_ids:
            live[request_id].num_preemptions += 1
        sampled = {s.request.request_id: PLACEHOLDER_TOKEN for s in out.scheduled if s.samples_token}
        updates = scheduler.update(out, sampled)
        _, used = scheduler.kv_slot_usage()
        step = SimStep(num_seqs=len(out.scheduled), num_prefill_tokens=out.num_prefill_tokens,
                       num_decode_tokens=out.num_decode_tokens, num_context_tokens=used)
        cost = step_cost(step)
        clock += cost
        run.busy_s += cost
        if keep_steps:
            run.steps.append(step)
        run.token_times.append((clock, len(updates)))
        for update in updates:
            outcome = live[update.request.request_id]
            if update.is_first_token:
                outcome.first_token_s = clock
            if update.request.is_finished:
                outcome.end_s = clock
                del live[update.request.request_id]
                next_send = clock + gap_s
                if users is not None and next_send <= stop_sending_s:
                    send(next_send, next(source))
    else:
        run.is_truncated = True
    run.end_s = clock
    return run


def _request(position: int, item: SimRequest, max_model_len: int, arrival_s: float) -> Request:
    prompt = list(item.prompt_token_ids)[: max_model_len - 1]
    max_tokens = max(1, min(item.num_output_tokens, max_model_len - len(prompt)))
    return Request(RequestId(f"sim-{position}"), prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   max_model_len, arrival_time=arrival_s)


def _unfinalized(config: EngineConfig) -> EngineConfig:
    raise ValueError("simulate() needs a finalized EngineConfig (max_model_len, max_num_batched_tokens and "
                     "num_kv_blocks set), such as a run's run.json records")
