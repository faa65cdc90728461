"""A capacity search's result: the concurrency a server sustains, its throughput there, and what limits it.

The search (loadtests.capacity) writes ``capacity.json`` (:class:`CapacitySearch`: the points in
the order it ran them, why it stopped, the tokens experiment) beside the sweep's ``sweep.json``.
:func:`capacity_result` reads the points back and decides:

- the capacity: with an SLO, the highest concurrency whose SLO attainment holds (Wilson interval
  shown); else the knee of throughput against concurrency (reports.capacity.knee), or, with no knee, the
  lightest point within ``PLATEAU_SHARE`` of the best throughput;
- what limits it, by experiment from the outside: no gain from 1 to 2 users is a serial server;
  past the knee, requests that all decode (none queued) mean the work saturates the device; a
  queue whose decoding streams fall in proportion to tokens per request (the tokens experiment)
  is memory, one that keeps the same number of streams is a seat limit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from probes.peaks import MachinePeaks
from probes.run_dir import CAPACITY_NAME, RunDirectory
from reports.capacity.bootstrap import CapacityInterval, capacity_interval
from reports.capacity.interval import RateInterval, batch_means_interval, token_rate_series
from reports.capacity.knee import KneeFit, fit_knee, wilson_interval
from reports.capacity.other_load import other_cpu_cores
from reports.dataset import RunDataset
from reports.summary import PointMeasures

# Without a knee, the capacity is the lightest point within this share of the best throughput.
PLATEAU_SHARE = 0.9
# The best throughput at more than 1 user over the throughput at 1 below this ratio: more users never
# became more throughput, so the server serves one request at a time. (Not 1 to 2 users alone: a
# batching server may gain nothing at 2 users and then scale, as transformers serve's continuous
# batching did on this machine, 12.8 tok/s at 1 and 2 users, 37.8 at 8.)
SERIAL_GAIN = 1.2
# Past the knee, at least this share of the open requests decoding at once: nothing queues them.
UNQUEUED_DECODING_SHARE = 0.8
# A serial server decodes one stream at a time: the client never sees this many decoding at once
# (time-averaged, at any point). A server that streams two at once is not serial, whatever its
# throughput did (transformers serve --continuous-batching with a KV pool of two requests: flat from
# 1 to 6 users, two streams at a time: memory, not seats, held it).
SERIAL_MAX_STREAMS = 1.5
# Default share of requests that must meet every SLO bound for a point to hold.
SLO_ATTAINMENT = 0.9
Limit = Literal["serial", "seats", "memory", "compute"]
LIMIT_BOTTLENECK: dict[str, str] = {"serial": "batching", "seats": "batching", "memory": "cache",
                                    "compute": "execution"}


@dataclass(slots=True)
class CapacitySearch:
    """What the search ran (``capacity.json``); the measures themselves are in each point's directory."""

    order: list[int]  # users of each point, in the order they ran
    stopped: str  # why the search stopped doubling
    slo_attainment: float = SLO_ATTAINMENT
    tokens_dir: str | None = None  # the tokens experiment's run directory, relative to the search's
    tokens_scale: float | None = None  # how many times the tokens per request it asked for
    model_bytes: int | None = None  # the served model's weight bytes, when given or known
    is_local: bool = False  # the target runs on this machine (its memory bandwidth is ours)
    probed: bool = False  # the engine's probes watched the search (diagnose): they, not experiments, tell the limit
    overloaded: list[dict[str, Any]] = field(default_factory=list)  # points that measured nothing: overloaded
    # The point where requests began to fail from overload (reports.failures): users, dir, why. It stays
    # in the sweep: its failures are the evidence of the limit, and the search stopped there.
    failed_at: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacitySearch:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclass(slots=True)
class CapacityPoint:
    """One point of the search as the capacity reads it."""

    users: int
    output_tokens_per_s: float | None  # tokens streamed inside the measured window / its length
    decoding_streams: float | None  # requests between first token and end, time-averaged over the window
    in_flight: float | None  # requests between send and end, time-averaged over the window
    tokens_per_request: float | None  # mean prompt + output tokens of the measured requests
    slo_attainment: dict[str, float] | None = None  # value, low, high (95% Wilson)
    goodput: float | None = None  # good requests / s
    output_tokens_per_s_interval: dict[str, float | int] | None = None  # RateInterval.to_dict()
    measured_s: float | None = None  # the measured window's length
    window: dict[str, Any] | None = None  # a controlled point's decisions (loadtests.point_stop.PointWindow)
    other_cpu_cores: float | None = None  # cores other processes took during the window (reports.capacity.other_load)

    @property
    def interval(self) -> RateInterval | None:
        i = self.output_tokens_per_s_interval
        return RateInterval.from_dict(i) if i is not None else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class TokensExperiment:
    """The knee point rerun with more tokens per request: does the number of decoding streams hold?"""

    users: int
    token_ratio: float  # tokens per request, experiment / base (measured)
    streams_ratio: float  # decoding streams, experiment / base
    exponent: float  # log(1/streams_ratio) / log(token_ratio): 0 holds the count (seats), 1 proportional (memory)
    limit: Limit

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class Capacity:
    """``diagnosis.json``'s ``capacity``: where the server saturates, and the evidence."""

    concurrency: int | None
    output_tokens_per_s: float | None
    goodput: float | None
    method: str  # slo, knee or plateau
    reason: str  # the capacity in words
    limit: Limit | None
    limit_evidence: str
    knee: KneeFit
    points: list[CapacityPoint]
    stopped: str
    past_knee_users: int | None = None  # the point past the capacity where its limit binds
    serial_gain: float | None = None  # the best throughput at more than 1 user / at 1
    max_decoding_streams: float | None = None  # the most streams decoding at once (time-averaged) at any point
    failed_at_users: int | None = None  # where requests began to fail from overload (the search stopped there)
    queue_share_past_knee: float | None = None  # decoding streams / open requests past the knee
    tokens: TokensExperiment | None = None
    probed: bool = False  # the engine's probes watched the search, so they tell the limit
    single_stream: dict[str, Any] | None = None  # TPOT at 1 user against weight bytes / bandwidth
    slo: dict[str, Any] = field(default_factory=dict)
    interval: dict[str, Any] | None = None  # the capacity's range in users (CapacityInterval.to_dict())
    output_tokens_per_s_interval: dict[str, float | int] | None = None  # the capacity point's RateInterval

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if f.name not in ("knee", "points", "tokens")},
                "knee": self.knee.to_dict(), "points": [p.to_dict() for p in self.points],
                "tokens": self.tokens.to_dict() if self.tokens is not None else None}


def read_search(path: str | Path) -> CapacitySearch | None:
    return RunDirectory(path).load(CAPACITY_NAME, CapacitySearch)


def measured_window(data: RunDataset) -> tuple[float, float] | None:
    """The measured window ``(start, end)``: the one a point's stopping rule decided (``load.json``), else the
    duration from the first measured send; None without either."""
    decided = data.load_info.window if data.load_info is not None else None
    if decided and decided.get("measure_from") is not None and decided.get("stop_at") is not None:
        return float(decided["measure_from"]), float(decided["stop_at"])
    start, duration = data.window[0], data.load_config.get("duration_s")
    if not math.isfinite(start) or not duration:
        return None
    return start, start + float(duration)


def token_arrivals(data: RunDataset) -> tuple[np.ndarray, np.ndarray] | None:
    """When every successful request's output tokens arrived: chunk times and tokens per chunk, all requests.

    NOTE: a request's tokens are spread evenly over its content chunks (a chunk may carry several);
    one without chunk times counts its tokens at its end.
    """
    client = data.client
    if client is None:
        return None
    ok = client[client["is_ok"].astype(bool)]
    times, weights = [], []
    for chunks, num_tokens, finished in zip(ok["token_times"], ok["num_output_tokens"], ok["end_time"], strict=True):
        at = np.asarray(chunks if chunks is not None and len(chunks) else [finished], dtype="float64")
        if len(at) and not np.isnan(num_tokens) and not np.isnan(at).any():
            times.append(at)
            weights.append(np.full(len(at), float(num_tokens) / len(at)))
    if not times:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(times), np.concatenate(weights)


def streamed_throughput(data: RunDataset) -> float | None:
    """Output tokens streamed inside the measured window, per second.

    NOTE: tokens count by when they arrived, whichever request they belong to, so the drain after
    the window (fewer users, longer at heavier points) does not read as lower throughput.
    """
    window, arrivals = measured_window(data), token_arrivals(data)
    if window is None or arrivals is None:
        return None
    (start, end), (times, weights) = window, arrivals
    return float(weights[(times >= start) & (times < end)].sum()) / (end - start)


def throughput_interval(data: RunDataset) -> RateInterval | None:
    """The batch-means interval of the streamed throughput (``reports.capacity.interval``), over the whole
    sub-windows of the measured window; None without enough of them."""
    window, arrivals = measured_window(data), token_arrivals(data)
    if window is None or arrivals is None:
        return None
    return batch_means_interval(token_rate_series(*arrivals, *window))


def time_averaged(data: RunDataset, begin: str) -> float | None:
    """Mean number of successful requests between their ``begin`` time and their end over the measured
    window (``send_time``: open; ``first_token_time``: decoding), counting requests sent in the warm-up too."""
    window = _ok_requests_and_window(data, begin)
    if window is None:
        return None
    ok, start, end = window
    overlap = (np.minimum(ok["end_time"], end) - np.maximum(ok[begin], start)).clip(lower=0.0)
    return float(overlap.sum()) / (end - start)


def _ok_requests_and_window(data: RunDataset, begin: str) -> tuple[pd.DataFrame, float, float] | None:
    """The successful client requests with a ``begin`` and an end time (warm-up ones too), and the
    measured window's start and end; None without a client table or a window."""
    client, window = data.client, measured_window(data)
    if client is None or window is None:
        return None
    return client[client["is_ok"].astype(bool)].dropna(subset=[begin, "end_time"]), *window


def _open_in_window(data: RunDataset) -> pd.DataFrame | None:
    """The successful requests open at some time in the measured window, those that end in the drain
    included: with long requests (the tokens experiment) none may end inside the window at all."""
    window = _ok_requests_and_window(data, "send_time")
    if window is None:
        return None
    ok, start, end = window
    return ok[(ok["end_time"] > start) & (ok["send_time"] < end)]


def capacity_point(data: RunDataset, measures: PointMeasures) -> CapacityPoint:
    c = measures.client
    tput = streamed_throughput(data)
    tput = tput if tput is not None else (c.output_throughput if c is not None else None)
    ok = _open_in_window(data)
    if ok is None:
        ok = data.latencies[data.latencies["is_ok"].astype(bool)]
    tokens = (ok["num_prompt_tokens"].fillna(0) + ok["num_output_tokens"].fillna(0)).mean() if len(ok) else None
    attainment = goodput = None
    if c is not None and c.goodput is not None and c.num_requests:
        attainment = wilson_interval(int(c.goodput["num_good"]), c.num_requests).to_dict()
        goodput = c.goodput["good_requests_per_s"]
    interval, window = throughput_interval(data), measured_window(data)
    return CapacityPoint(users=int(measures.concurrency or 0), output_tokens_per_s=tput,
                         decoding_streams=time_averaged(data, "first_token_time"),
                         in_flight=time_averaged(data, "send_time"),
                         tokens_per_request=float(tokens) if tokens is not None else None,
                         slo_attainment=attainment, goodput=goodput,
                         output_tokens_per_s_interval=interval.to_dict() if interval is not None else None,
                         measured_s=window[1] - window[0] if window is not None else None,
                         window=data.load_info.window if data.load_info is not None else None,
                         other_cpu_cores=other_cpu_cores(data, *window) if window is not None else None)


def capacity_result(root: Path, search: CapacitySearch, points: list[RunDataset],
                    measures: list[PointMeasures]) -> Capacity:
    """The capacity of the searched server; ``points`` and ``measures`` in order of users."""
    cps = [capacity_point(d, m) for d, m in zip(points, measures, strict=True)]
    rated = [p for p in cps if p.output_tokens_per_s is not None]
    knee = fit_knee([p.users for p in rated], [p.output_tokens_per_s for p in rated])  # type: ignore[misc]
    slo = dict(points[0].load_config.get("slo") or {}) if points else {}
    chosen, method, reason = _choose(cps, rated, knee, slo, search.slo_attainment)
    interval = None
    if chosen is not None and method != "slo":
        interval = _interval(rated, chosen.users)
        if interval is not None and not interval.is_told_apart:
            method, reason = "undetermined", (
                f"the points cannot be told apart: redrawn within their intervals, the capacity falls anywhere "
                f"in {interval.low}-{interval.high} users ({interval.confidence:.0%}), so none is named "
                f"(the measured curve alone gives {chosen.users}: {reason})")
            chosen = None
    result = Capacity(concurrency=chosen.users if chosen else None,
                      output_tokens_per_s=chosen.output_tokens_per_s if chosen else None,
                      goodput=chosen.goodput if chosen else None, method=method, reason=reason, limit=None,
                      limit_evidence="", knee=knee, points=cps, stopped=search.stopped,
                      slo={"bounds_s": slo, "attainment": search.slo_attainment} if slo else {},
                      probed=search.probed, failed_at_users=(search.failed_at or {}).get("users"),
                      interval=interval.to_dict() if interval is not None else None,
                      output_tokens_per_s_interval=chosen.output_tokens_per_s_interval if chosen else None)
    by_users = {p.users: p for p in rated}
    result.serial_gain = serial_gain({u: p.output_tokens_per_s for u, p in by_users.items()})
    streams = [p.decoding_streams for p in cps if p.decoding_streams is not None]
    result.max_decoding_streams = max(streams) if streams else None
    if chosen is not None:
        past = next((p for p in cps if p.users > chosen.users), None)
        if past is not None:
            result.past_knee_users = past.users
            if past.decoding_streams is not None and past.in_flight:
                result.queue_share_past_knee = past.decoding_streams / past.in_flight
    result.tokens = _tokens_experiment(root, search, by_users)
    result.limit, result.limit_evidence = _limit(result)
    result.single_stream = single_stream(by_users.get(1), points, search, RunDirectory(root).read_peaks())
    return result


def serial_gain(throughput_by_users: dict[int, float | None]) -> float | None:
    """The best output throughput at more than 1 user over the throughput at 1 (None without both)."""
    one = throughput_by_users.get(1)
    more = [t for u, t in throughput_by_users.items() if u > 1 and t is not None]
    return max(more) / one if one and more else None


def _choose(cps: list[CapacityPoint], rated: list[CapacityPoint], knee: KneeFit, slo: dict[str, float],
            target: float) -> tuple[CapacityPoint | None, str, str]:
    if slo:
        holding = [p for p in cps if p.slo_attainment is not None and p.slo_attainment["value"] >= target]
        if not holding:
            return None, "slo", f"no measured point met the SLO for {target:.0%} of its requests"
        best = max(holding, key=lambda p: p.users)
        a = best.slo_attainment
        assert a is not None
        return best, "slo", (f"the most users whose SLO attainment holds: {a['value']:.0%} of requests within the SLO "
                             f"(95% Wilson interval {a['low']:.0%}-{a['high']:.0%}; target {target:.0%})")
    if not rated:
        return None, "plateau", "no point measured any output"
    users = choose_users([p.users for p in rated], [p.output_tokens_per_s for p in rated], knee)  # type: ignore[misc]
    point = next(p for p in rated if p.users == users)
    if knee.has_knee:
        return point, "knee", f"the knee of throughput against users: {knee.reason}"
    return point, "plateau", (f"{knee.reason}; the capacity is the fewest users within {PLATEAU_SHARE:.0%} of the "
                              f"best throughput measured")


def choose_users(users: list[int], throughputs: list[float], knee: KneeFit | None = None) -> int:
    """The capacity of one throughput curve, in users: its knee (``knee``, else fitted), or without one the
    fewest users within ``PLATEAU_SHARE`` of the best throughput."""
    knee = knee if knee is not None else fit_knee(users, throughputs)  # type: ignore[arg-type]
    if knee.has_knee and knee.breakpoint is not None:
        return int(knee.breakpoint)
    top = max(throughputs)
    return min(u for u, t in zip(users, throughputs, strict=True) if t >= PLATEAU_SHARE * top)


def _interval(rated: list[CapacityPoint], estimate: int) -> CapacityInterval | None:
    """The capacity's interval from the points' own (None when a point has none: too short a window)."""
    intervals = [p.interval for p in rated]
    if any(i is None for i in intervals):
        return None
    return capacity_interval([p.users for p in rated], intervals, estimate, choose_users)  # type: ignore[arg-type]


def _tokens_experiment(root: Path, search: CapacitySearch, by_users: dict[int, CapacityPoint]) -> TokensExperiment | None:
    if search.tokens_dir is None or not (root / search.tokens_dir).is_dir():
        return None
    from reports.summary import point_measures

    data = RunDataset.load(root / search.tokens_dir)
    measured = capacity_point(data, point_measures(data))
    base = by_users.get(measured.users)
    if base is None or not base.decoding_streams or not measured.decoding_streams or not base.tokens_per_request \
            or not measured.tokens_per_request:
        return None
    token_ratio = measured.tokens_per_request / base.tokens_per_request
    streams_ratio = measured.decoding_streams / base.decoding_streams
    if token_ratio <= 1.2:
        return None
    exponent = math.log(1 / streams_ratio) / math.log(token_ratio)
    return TokensExperiment(users=measured.users, token_ratio=token_ratio, streams_ratio=streams_ratio,
                            exponent=exponent, limit="memory" if exponent >= 0.5 else "seats")


def is_serial(c: Capacity) -> bool:
    """Flat throughput from 1 user on, and never two streams decoding at once."""
    return (c.serial_gain is not None and c.serial_gain < SERIAL_GAIN
            and (c.max_decoding_streams is None or c.max_decoding_streams < SERIAL_MAX_STREAMS))


def is_compute(c: Capacity) -> bool:
    """Past the capacity, every open request decoding (time-averaged): none queued for seats or memory."""
    return c.queue_share_past_knee is not None and c.queue_share_past_knee >= UNQUEUED_DECODING_SHARE


def _limit(c: Capacity) -> tuple[Limit | None, str]:
    if is_serial(c):
        return "serial", (f"throughput grew at most {c.serial_gain:.2f}x from 1 user to any heavier point (under "
                          f"{SERIAL_GAIN}x) and at most {c.max_decoding_streams or 1:.2f} streams decoded at once: "
                          f"the server serves one request at a time")
    t = c.tokens
    # NOTE: memory before compute: past a compute reading a tokens experiment runs only where a heavier point
    # queued (loadtests.capacity.tokens_experiment_users), and streams that fall with longer requests there
    # mean memory admitted fewer; a seat limit found there comes after compute (seats filled past saturation).
    if t is not None and t.limit == "memory":
        return "memory", (f"at {t.users} users, {t.token_ratio:.1f}x the tokens per request gave {t.streams_ratio:.2f}x "
                          f"the decoding streams; the decoding streams fell in proportion: the KV cache (memory) "
                          f"holds fewer requests")
    if is_compute(c):
        return "compute", (f"past the capacity, at {c.past_knee_users} users, {c.queue_share_past_knee:.0%} of the open "
                           f"requests were decoding at once: none queued, each got slower, so the work itself "
                           f"saturates the device")
    if t is not None:
        return t.limit, (f"at {t.users} users, {t.token_ratio:.1f}x the tokens per request gave {t.streams_ratio:.2f}x "
                         f"the decoding streams; the same number of requests kept decoding: a seat limit (max sequences)")
    if c.method == "undetermined":
        return None, ("no capacity was named (its points cannot be told apart), so no point past it is read; the "
                      "verdict is read at the heaviest point")
    if c.queue_share_past_knee is not None and c.probed:
        return None, (f"past the capacity {c.queue_share_past_knee:.0%} of the open requests were decoding: requests "
                      f"queue; the engine's probes say why (the verdict, read at {c.past_knee_users} users)")
    if c.queue_share_past_knee is not None:
        return None, (f"past the capacity {c.queue_share_past_knee:.0%} of the open requests were decoding: requests "
                      f"queue, but no tokens experiment says whether for seats or memory")
    return None, "no point past the capacity was measured, so what holds it is not known from the outside"


def single_stream(point: CapacityPoint | None, points: list[RunDataset], search: CapacitySearch,
                  peaks: MachinePeaks | None) -> dict[str, Any] | None:
    """The memory-bandwidth utilisation one stream reaches: weight bytes per TPOT at 1 user over the copy bandwidth.

    Only for a target on this machine (its bandwidth is the one measured) with known weight bytes.
    """
    one = next((d for d in points if d.concurrency == 1), None)
    if one is None or point is None:
        return None
    peaks = peaks or one.peaks
    weight_bytes = search.model_bytes or (one.model_shape.weight_bytes if one.model_shape is not None else None)
    tpot = one.latencies.loc[one.latencies["is_ok"].astype(bool), "tpot_s"].dropna()
    out: dict[str, Any] = {"tpot_s": float(tpot.median()) if len(tpot) else None, "weight_bytes": weight_bytes,
                           "bandwidth_bytes_per_s": peaks.bandwidth_bytes_per_s if peaks else None, "mbu": None}
    if not search.is_local:
        out["why_not"] = "the target is not on this machine, so its memory bandwidth was not measured"
    elif weight_bytes is None:
        out["why_not"] = "the model's weight bytes are unknown (pass --model-bytes)"
    elif peaks is None or out["tpot_s"] is None:
        out["why_not"] = "no bandwidth measured or no TPOT at 1 user"
    else:
        mbu = weight_bytes / out["tpot_s"] / peaks.bandwidth_bytes_per_s
        if mbu <= 1.0:
            out["mbu"] = mbu
        else:
            out["why_not"] = (f"the weights over TPOT give {mbu:.2f} of the bandwidth, above 1: the TPOT seen by the "
                              f"client is not the time per token (tokens arrive in bursts) or the model is not "
                              f"{weight_bytes} bytes")
    return out


def capacity_focus(capacity: Capacity, measures: list[PointMeasures]) -> int:
    """Index of the point the verdict is read at (see :func:`focus_users`): past the capacity, where its limit
    binds (at the capacity itself it only starts to)."""
    users = [int(m.concurrency or 0) for m in measures]
    return users.index(focus_users(capacity, users))


def focus_users(capacity: Capacity, users: list[int]) -> int:
    """Of the measured ``users`` (in order of users), the point the verdict is read at: where requests began to
    fail from overload (their failures say which limit), else the first one past the capacity, else the
    capacity point, else the heaviest."""
    for wanted in (capacity.failed_at_users, capacity.past_knee_users, capacity.concurrency):
        if wanted is not None and wanted in users:
            return wanted
    return users[-1]
