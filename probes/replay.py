"""Replay a run's measured requests through the engine's scheduler on a simulated clock (engine.simulator).

What reports need from the simulator, in the run directory's own terms: the engine config as
``run.json`` records it (with a lever's changes applied), each measured request's prompt and
output length, the run's arrivals (closed-loop users or open-loop send times), and a step-cost
function. The result is measured the way the client rows of a real run are: throughput over the
window from the first measured send to the last measured end, TTFT and TPOT percentiles.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.config import EngineConfig
from engine.simulator import SimRequest, SimRun, SimStep, simulate

__all__ = ["EngineConfig", "ReplayLoad", "ReplayMeasures", "SimRequest", "SimStep", "pseudo_token_ids", "replay"]


@dataclass(frozen=True, slots=True)
class ReplayLoad:
    """The load to replay: ``users`` closed-loop clients (else each request's own ``arrival_s``), the
    warm-up and measured seconds, and the client's own time between a response and its next request.

    Requests sent from ``warmup_s`` on are measured; sending stops at ``warmup_s + duration_s``.
    """

    users: int | None
    warmup_s: float
    duration_s: float
    gap_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ReplayMeasures:
    """A replay measured as a run's client rows are."""

    num_requests: int
    steady_throughput: float | None  # output tokens out between the end of the warm-up and the last send, per s
    output_throughput: float | None  # output tokens of the measured requests over their window (as a run's rows)
    request_throughput: float | None
    ttft_p50: float | None
    tpot_p50: float | None
    e2e_p50: float | None
    busy_fraction: float
    num_preemptions: int
    is_truncated: bool

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def pseudo_token_ids(texts: Sequence[str], num_tokens: Sequence[int]) -> list[list[int]]:
    """Stand-in token ids that keep the prompts' shared prefixes: each prompt cut into chunks of the
    workload's mean characters per token, each chunk hashed to an id, then cut or padded to its
    measured token count. Two prompts sharing N characters share about N / that many leading ids.
    """
    total_chars, total_tokens = sum(len(t) for t in texts), sum(num_tokens)
    chars_per_token = max(1, round(total_chars / total_tokens)) if total_tokens else 1
    out = []
    for index, (text, count) in enumerate(zip(texts, num_tokens, strict=True)):
        ids = [zlib.crc32(text[i:i + chars_per_token].encode()) for i in range(0, len(text), chars_per_token)]
        ids = ids[:count]
        # NOTE: the padding is unique to the request, so it never makes a false prefix hit.
        ids += [zlib.crc32(f"pad-{index}-{j}".encode()) for j in range(count - len(ids))]
        out.append(ids)
    return out


def engine_config(recorded: Mapping[str, Any], changes: Mapping[str, Any] | None = None) -> EngineConfig:
    """The engine config ``run.json`` recorded (already finalized), with ``changes`` applied."""
    fields = set(EngineConfig.__dataclass_fields__)
    values = {k: v for k, v in recorded.items() if k in fields}
    values.update(changes or {})
    if values.get("num_kv_blocks") is not None:
        values["kv_cache_mb"] = None
    config = EngineConfig(**values)
    if not config.is_finalized:
        raise ValueError(f"the run's engine config is not finalized (missing max_model_len, max_num_batched_tokens "
                         f"or num_kv_blocks): {dict(recorded)}")
    return config


def replay(config: EngineConfig, requests: Sequence[SimRequest], load: ReplayLoad,
           step_cost: Callable[[SimStep], float]) -> ReplayMeasures:
    """Simulate the load on ``config`` and measure it from the first request sent after the warm-up."""
    run = simulate(config, requests, step_cost, users=load.users, stop_sending_s=load.warmup_s + load.duration_s,
                   gap_s=load.gap_s)
    return measure(run, load.warmup_s, load.duration_s)


def measure(run: SimRun, warmup_s: float, duration_s: float) -> ReplayMeasures:
    """The replay measured as a run is: tokens out while sending (every request counts by its progress, finished
    or not), and the window figures of the measured requests that finished (None when none did)."""
    stop = warmup_s + duration_s
    steady = sum(n for t, n in run.token_times if warmup_s < t <= stop) / duration_s if duration_s > 0 else None
    busy = min(run.busy_s / run.end_s, 1.0) if run.end_s > 0 else 0.0
    sent = [o for o in run.outcomes if o.send_s >= warmup_s]
    measured = [o for o in sent if o.end_s is not None]

    def p50(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None and math.isfinite(v)]
        return float(np.percentile(kept, 50)) if kept else None

    preemptions = sum(o.num_preemptions for o in run.outcomes)
    if not measured:
        # NOTE: in flight at the end, a request still has its first token time if it got one
        return ReplayMeasures(0, steady, None, None, p50([o.ttft_s for o in sent]), None, None, busy, preemptions,
                              run.is_truncated)
    start = min(o.send_s for o in measured)
    end = max(o.end_s for o in measured if o.end_s is not None)
    window = end - start
    return ReplayMeasures(
        num_requests=len(measured), steady_throughput=steady,
        output_throughput=sum(o.num_output_tokens for o in measured) / window if window > 0 else None,
        request_throughput=len(measured) / window if window > 0 else None,
        ttft_p50=p50([o.ttft_s for o in measured]), tpot_p50=p50([o.tpot_s for o in measured]),
        e2e_p50=p50([o.e2e_s for o in measured]), busy_fraction=busy, num_preemptions=preemptions,
        is_truncated=run.is_truncated)
