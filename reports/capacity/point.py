"""One point of a capacity search as the capacity reads it: its streamed throughput and its interval, the
streams decoding and the requests open over the measured window, its SLO attainment."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from reports.capacity.interval import SUB_WINDOW_S, RateInterval, batch_means_interval, token_rate_series
from reports.capacity.knee import wilson_interval
from reports.capacity.other_load import other_cpu_cores
from reports.capacity.records import CapacityPoint
from reports.dataset import RunDataset
from reports.summary import PointMeasures


def measured_window(data: RunDataset) -> tuple[float, float] | None:
    """The measured window ``(start, end)``: the one a point's stopping rule decided (``load.json``), else the
    duration from the first measured send; None without either."""
    decided = data.load_info.decided_window if data.load_info is not None else None
    if decided is not None:
        return decided
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


def prefill_rate_series(data: RunDataset, start: float, end: float, width: float = SUB_WINDOW_S) -> np.ndarray | None:
    """Prompt tokens prefilled per second in each whole sub-window of ``width`` from ``start``: each request's
    uncached prompt tokens spread evenly over its prefill, from the engine's first scheduling of it to its
    first token (the engine's request probe), else from the client's send to its first token (queueing
    included); None without either table.
    """
    requests = data.frame("requests") if data.has_engine_probes else None
    if requests is not None and len(requests):
        begin, end_col, rows = "first_scheduled_time", "first_token_time", requests
    elif data.client is not None:
        begin, end_col, rows = "send_time", "first_token_time", data.client[data.client["is_ok"].astype(bool)]
    else:
        return None
    rows = rows.dropna(subset=[begin, end_col, "num_prompt_tokens"])
    num = int(math.floor((end - start) / width + 1e-9))
    if num < 1:
        return np.zeros(0)
    edges = start + width * np.arange(num + 1)
    tokens = (rows["num_prompt_tokens"] - rows["num_cached_tokens"].fillna(0)).clip(lower=0).to_numpy(float)
    first, last = rows[begin].to_numpy(float), rows[end_col].to_numpy(float)
    overlap = (np.minimum(edges[1:], last[:, None]) - np.maximum(edges[:-1], first[:, None])).clip(0)
    share = overlap / np.maximum(last - first, 1e-6)[:, None]
    instant = last - first <= 1e-6  # NOTE: a prefill of no length counts in the sub-window it ended in
    share[instant] = (edges[:-1] <= last[instant, None]) & (last[instant, None] < edges[1:])
    return (tokens @ share) / width


def throughput_interval(data: RunDataset) -> RateInterval | None:
    """The batch-means interval of the streamed throughput (``reports.capacity.interval``), over the whole
    sub-windows of the measured window, with the prefill rate as its control; None without enough of them."""
    window, arrivals = measured_window(data), token_arrivals(data)
    if window is None or arrivals is None:
        return None
    rates = token_rate_series(*arrivals, *window)
    prefill = prefill_rate_series(data, *window)
    return batch_means_interval(rates, control=prefill if prefill is not None and len(prefill) == len(rates) else None)


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
