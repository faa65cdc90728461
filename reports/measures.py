"""The figures a diagnosis and a report are built on, computed once from a :class:`RunDataset`.

Three sources, each optional: the engine's steps (``ServerMeasures``), what the clients saw
(``ClientMeasures``, and ``OpenLoopMeasures`` for an open loop's schedule), and an external server's
``/metrics`` (``PrometheusMeasures``, beside the adapters that read them: reports.metric_adapters).
Step figures are weighted by step time, so a long prefill step counts for the time it held the device.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from reports.dataset import RunDataset

PERCENTILES = (50, 90, 95, 99)
MAX_ERRORS_SHOWN = 5
# Why requests waited, one label per step in which some did (see waiting_limits).
LIMIT_CAP, LIMIT_MEMORY, LIMIT_BUDGET, LIMIT_IDLE = "max_num_seqs", "kv_memory", "token_budget", "idle_seats"
WAIT_LIMITS = (LIMIT_CAP, LIMIT_MEMORY, LIMIT_BUDGET, LIMIT_IDLE)


def distribution(values: Any) -> dict[str, float] | None:
    """Mean, p50/p90/p95/p99, max and count of ``values`` (NaNs dropped); None when there are none."""
    array = np.asarray(pd.Series(values, dtype="float64").dropna())
    if array.size == 0:
        return None
    out = {"mean": float(array.mean())}
    out.update({f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES})
    out.update(max=float(array.max()), count=int(array.size))
    return out


@dataclass(slots=True)
class ServerMeasures:
    """What the engine's step rows say about the measurement window."""

    num_steps: int
    busy_fraction: float  # step time / window: how much of the run the engine was working
    mean_batch: float  # sequences per step, step-time weighted
    max_batch: int
    max_num_seqs: int | None
    kv_pool_blocks: int | None  # None: the engine has no block pool (naive/static baselines)
    kv_capacity_seqs: float | None  # requests of this run's mean size the pool holds at once
    batch_limit: float | None  # min(max_num_seqs, kv_capacity_seqs)
    waiting_share: float  # share of busy time with requests waiting
    mean_waiting: float
    wait_limits: dict[str, float]  # share of the waiting time each limit explains (WAIT_LIMITS)
    kv_usage_mean: float | None
    kv_usage_p90: float | None
    kv_usage_peak: float | None
    kv_waste: float | None  # allocated-but-unused share of the KV slots running requests hold
    num_preemptions: int
    preemptions_per_request: float | None
    host_share: float  # schedule + prepare + sample + output + host overhead, over step time
    gap_share: float  # engine idle between steps while work was pending, over busy time + those gaps
    overhead_share: float  # host time and pending gaps together, over busy time + gaps
    mean_step_s: float
    forward_share: float
    prefix_hit_rate: float | None
    queue_time_s: dict[str, float] | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class ClientMeasures:
    """What the requests' own timings say (client rows when there are any, else the engine's request rows)."""

    source: str  # "client" or "server"
    num_requests: int
    num_ok: int
    num_failed: int
    window_s: float
    request_throughput: float | None  # finished requests / s
    output_throughput: float | None  # output tokens / s
    ttft_s: dict[str, float] | None
    tpot_s: dict[str, float] | None
    itl_s: dict[str, float] | None
    e2e_s: dict[str, float] | None
    in_flight: float | None  # mean requests open at once (Little's law: sum of E2E / window)
    decoding_streams: float | None  # output tok/s x mean TPOT: streams decoding at once
    goodput: dict[str, Any] | None
    errors: dict[str, int] = dataclasses.field(default_factory=dict)  # the commonest failures, by message
    status_codes: dict[str, int] = dataclasses.field(default_factory=dict)  # of the failed requests
    # Sent twice: the pooled connection closed before any answer (loadtests.client.stream_client); not failures.
    num_retried: int = 0
    # The server's own timings (llama.cpp's ``timings``), when its streams carry them: its decode time per
    # token, and how long before the server began the prompt (TTFT less its prompt time: the wait for a slot).
    server_tpot_s: dict[str, float] | None = None
    wait_before_prompt_s: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class OpenLoopMeasures:
    """Whether an open-loop generator kept to its schedule."""

    offered_rate_per_s: float | None
    achieved_send_rate_per_s: float
    send_lag_s: dict[str, float] | None  # send time - scheduled time

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- server -----------------------------------------------------------------------------------
def server_measures(data: RunDataset) -> ServerMeasures | None:
    steps = data.steps_in_window()
    if steps.empty:
        return None
    config = data.engine_config
    weight = steps["total_s"].to_numpy(dtype=float)
    busy_s = float(weight.sum())
    window_s = data.window_s or busy_s
    pool = steps["num_kv_blocks_used"] + steps["num_kv_blocks_free"]
    pool_blocks = int(pool.max()) if len(pool) and pool.max() > 0 else None
    usage = (steps["num_kv_blocks_used"] / pool) if pool_blocks else None
    capacity = _kv_capacity_seqs(data, pool_blocks)
    max_num_seqs = config.get("max_num_seqs")
    limits = [v for v in (max_num_seqs, capacity) if v is not None]
    waiting = steps["num_waiting"].to_numpy() > 0
    labels = waiting_limits(data, steps, pool_blocks)
    waiting_weight = float(weight[waiting].sum())
    wait_limits = {name: (float(weight[labels == name].sum()) / waiting_weight if waiting_weight else 0.0)
                   for name in WAIT_LIMITS}
    host_s = steps[["schedule_s", "prepare_s", "sample_s", "output_s", "host_overhead_s"]].to_numpy().sum()
    gaps = pending_gaps(steps)
    allocated = float(steps["num_kv_slots_allocated"].sum())
    used_slots = float(steps["num_kv_slots_used"].sum())
    prefill = float(steps["num_prefill_tokens"].sum())
    hits = float(steps["num_prefix_hit_tokens"].sum())
    requests = data.frame("requests")
    start, end = data.window
    finished = requests["finish_time"].between(start, end) if len(requests) else requests["is_finished"]
    num_requests = int(finished.sum())
    preemptions = int(steps["num_preemptions"].sum())
    return ServerMeasures(
        num_steps=len(steps), busy_fraction=min(busy_s / window_s, 1.0) if window_s > 0 else 1.0,
        mean_batch=_weighted_mean(steps["num_seqs"], weight), max_batch=int(steps["num_seqs"].max()),
        max_num_seqs=int(max_num_seqs) if max_num_seqs is not None else None, kv_pool_blocks=pool_blocks,
        kv_capacity_seqs=capacity, batch_limit=float(min(limits)) if limits else None,
        waiting_share=float(weight[waiting].sum()) / busy_s if busy_s else 0.0,
        mean_waiting=_weighted_mean(steps["num_waiting"], weight), wait_limits=wait_limits,
        kv_usage_mean=_weighted_mean(usage, weight) if usage is not None else None,
        kv_usage_p90=float(np.percentile(usage, 90)) if usage is not None else None,
        kv_usage_peak=float(usage.max()) if usage is not None else None,
        kv_waste=1.0 - used_slots / allocated if allocated else None,
        num_preemptions=preemptions, preemptions_per_request=preemptions / num_requests if num_requests else None,
        host_share=float(host_s) / busy_s if busy_s else 0.0,
        gap_share=gaps / (busy_s + gaps) if busy_s + gaps else 0.0,
        overhead_share=(float(host_s) + gaps) / (busy_s + gaps) if busy_s + gaps else 0.0,
        mean_step_s=busy_s / len(steps), forward_share=float(steps["forward_s"].sum()) / busy_s if busy_s else 0.0,
        prefix_hit_rate=hits / (hits + prefill) if hits + prefill else None,
        queue_time_s=distribution(requests["queue_time_s"]) if len(requests) else None,
    )


def waiting_limits(data: RunDataset, steps: pd.DataFrame, pool_blocks: int | None) -> np.ndarray:
    """Per step: which limit kept the requests still waiting after it out of its batch ("" if none waited).

    Checked in this order: a preemption in the step, or too few blocks left for the next request
    once the step's own prefill took its share (memory); the batch at ``max_num_seqs`` (the cap); the step's tokens at
    ``max_num_batched_tokens`` (the budget); else seats and memory were there and the scheduler
    left them empty (a static or one-at-a-time server).
    """
    config = data.engine_config
    max_num_seqs = config.get("max_num_seqs")
    budget = config.get("max_num_batched_tokens")
    needed = _blocks_to_admit(data)
    block_size = config.get("block_size") or 1
    # NOTE: the step was scheduled from the free blocks the previous step left; what its prefill
    # took of them was no longer there for the next waiting request.
    free_before = steps["num_kv_blocks_free"].shift(1).fillna(steps["num_kv_blocks_free"]).to_numpy()
    free_left = free_before - np.ceil(steps["num_prefill_tokens"].to_numpy() / block_size)
    labels = np.full(len(steps), "", dtype=object)
    tokens = (steps["num_prefill_tokens"] + steps["num_decode_tokens"]).to_numpy()
    for i, row in enumerate(steps.itertuples(index=False)):
        if row.num_waiting <= 0:
            continue
        if row.num_preemptions > 0 or (pool_blocks and needed is not None and free_left[i] < needed):
            labels[i] = LIMIT_MEMORY
        elif max_num_seqs is not None and row.num_seqs >= max_num_seqs:
            labels[i] = LIMIT_CAP
        elif budget is not None and tokens[i] >= budget:
            labels[i] = LIMIT_BUDGET
        else:
            labels[i] = LIMIT_IDLE
    return labels


def pending_gaps(steps: pd.DataFrame) -> float:
    """Seconds between the end of a step and the start of the next while requests were still in the engine."""
    if len(steps) < 2:
        return 0.0
    ends = (steps["start_time"] + steps["total_s"]).to_numpy()[:-1]
    gaps = steps["start_time"].to_numpy()[1:] - ends
    pending = (steps["num_running"] + steps["num_waiting"]).to_numpy()[:-1] > 0
    return float(np.clip(gaps[pending], 0.0, None).sum())


def _blocks_to_admit(data: RunDataset) -> int | None:
    """KV blocks the next waiting request needs to be admitted: its first chunk, or a whole reservation."""
    config = data.engine_config
    block_size = config.get("block_size")
    if not block_size:
        return None
    if config.get("kv_layout") == "contiguous" and config.get("max_model_len"):
        return math.ceil(config["max_model_len"] / block_size)
    prompts = _request_sizes(data)[0]
    if prompts is None:
        return None
    first_chunk = min(prompts, config.get("max_num_batched_tokens") or prompts)
    return math.ceil((first_chunk + 1) / block_size)


def _kv_capacity_seqs(data: RunDataset, pool_blocks: int | None) -> float | None:
    """How many requests of this run's mean size (prompt + output) the block pool holds at once."""
    config = data.engine_config
    block_size = config.get("block_size")
    if not pool_blocks or not block_size:
        return None
    if config.get("kv_layout") == "contiguous" and config.get("max_model_len"):
        return pool_blocks / math.ceil(config["max_model_len"] / block_size)
    prompt, output = _request_sizes(data)
    if prompt is None or output is None:
        return None
    return pool_blocks / math.ceil((prompt + output) / block_size)


def _request_sizes(data: RunDataset) -> tuple[float | None, float | None]:
    """Mean prompt and output tokens per request (the engine's rows, else the client's)."""
    for frame in (data.frame("requests"), data.latencies):
        if len(frame) and frame["num_prompt_tokens"].notna().any():
            return float(frame["num_prompt_tokens"].mean()), float(frame["num_output_tokens"].fillna(0).mean())
    return None, None


def _weighted_mean(values: Any, weight: np.ndarray) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.average(values, weights=weight)) if weight.sum() > 0 else float(values.mean())


# -- client -----------------------------------------------------------------------------------
def client_measures(data: RunDataset, slo: dict[str, float] | None = None) -> ClientMeasures | None:
    rows = data.latencies
    if rows.empty:
        return None
    ok = rows[rows["is_ok"].astype(bool)]
    failed = rows[~rows["is_ok"].astype(bool)]
    window_s = data.window_s
    itl = [gap for gaps in ok["itl_s"] if gaps is not None for gap in gaps]
    output_tput = float(ok["num_output_tokens"].sum()) / window_s if window_s > 0 else None
    tpot = distribution(ok["tpot_s"])
    slo = slo if slo is not None else dict(data.load_config.get("slo") or {})
    return ClientMeasures(
        source=data.latency_source, num_requests=len(rows), num_ok=len(ok), num_failed=len(rows) - len(ok),
        window_s=window_s, request_throughput=len(ok) / window_s if window_s > 0 else None,
        output_throughput=output_tput, ttft_s=distribution(ok["ttft_s"]), tpot_s=tpot,
        itl_s=distribution(itl), e2e_s=distribution(ok["e2e_s"]),
        in_flight=float(ok["e2e_s"].sum()) / window_s if window_s > 0 else None,
        decoding_streams=output_tput * tpot["mean"] if output_tput is not None and tpot else None,
        goodput=goodput(rows, slo, window_s) if slo else None,
        errors={str(k): int(v) for k, v in
                failed["error"].fillna("").astype(str).value_counts().head(MAX_ERRORS_SHOWN).items()},
        status_codes={str(k): int(v) for k, v in failed["status_code"].fillna(0).astype(int).value_counts().items()},
        num_retried=int((rows["num_retries"].fillna(0) > 0).sum()) if "num_retries" in rows else 0,
        **_server_timings(ok),
    )


def _server_timings(ok: pd.DataFrame) -> dict[str, dict[str, float] | None]:
    """The server's own decode time per token and the time before its prompt began, over the successful rows."""
    if "server_decode_s" not in ok or ok["server_decode_s"].isna().all():
        return {}
    per_token = ok["server_decode_s"] / ok["server_decode_tokens"].where(ok["server_decode_tokens"] > 0)
    return {"server_tpot_s": distribution(per_token),
            "wait_before_prompt_s": distribution((ok["ttft_s"] - ok["server_prompt_s"]).clip(lower=0.0))}


def goodput(rows: pd.DataFrame, slo: dict[str, float], window_s: float) -> dict[str, Any]:
    """The share of measured requests that succeeded within every SLO bound, and their rate.

    A bound on a latency the request does not have (TPOT of a one-token answer) does not fail it.
    """
    meets = rows["is_ok"].astype(bool)
    for metric, bound in slo.items():
        values = rows[f"{metric}_s"]
        meets &= values.isna() | (values <= bound)
    num_good = int(meets.sum())
    return {"slo_s": dict(slo), "num_good": num_good, "fraction": num_good / len(rows) if len(rows) else None,
            "good_requests_per_s": num_good / window_s if window_s > 0 else None}


def open_loop_measures(data: RunDataset) -> OpenLoopMeasures | None:
    """Offered against achieved send rate and the send lag, for an open-loop point with client rows."""
    if data.load_config.get("mode") != "open" or data.client is None:
        return None
    measured = data.client[~data.client["is_warmup"]]
    if len(measured) < 2:
        return None
    sends = np.sort(measured["send_time"].to_numpy())
    return OpenLoopMeasures(
        offered_rate_per_s=data.load_config.get("rate"),
        achieved_send_rate_per_s=(len(sends) - 1) / float(sends[-1] - sends[0]),
        send_lag_s=distribution(measured["send_time"] - measured["scheduled_time"]),
    )
