"""A server's own ``/metrics``: which of its samples carry the signals the external rules read, and the
measures read off the scrapes with them (:class:`PrometheusMeasures`).

Each server family names its queue, batch, KV-usage and preemption figures its own way; one
:class:`MetricAdapter` per family maps them to the five signals below, by the sample names that
:mod:`probes.prometheus` stores (the names ``prometheus_client``'s parser gives: a counter's
sample always ends in ``_total``, even where the server wrote it without). The adapter of a run
is the registered one whose queue gauge the scrapes hold; a run whose ``/metrics`` matches none
has no server-side measures, and the client-side evidence decides.

Every KV figure here is a 0..1 share of the server's KV pool, whatever its name says (vLLM's
``*_perc`` is documented as "1 means 100 percent usage").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from reports.dataset import RunDataset

SIGNALS = ("running", "waiting", "kv_usage", "preemptions", "finished")


@dataclass(frozen=True, slots=True)
class MetricAdapter:
    """One server family's sample names per signal, each a tuple tried in order (newer names first).

    ``kv_tokens`` is a (used, capacity) pair of gauges for a server that exports its KV pool in
    tokens instead of a usage share; the usage is their ratio. Gauges are per engine or per rank
    where the server runs several (a label tells them apart): counts are summed over the label
    sets of one scrape, shares averaged.
    """

    name: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...] = ()
    kv_tokens: tuple[str, str] | None = None
    preemptions: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    # (running mean of sequences per forward step since the server started, forward steps counter): the
    # mean batch over a window is the change in their product over the change in steps (llama.cpp).
    batch_per_step: tuple[str, str] | None = None
    output_tokens: tuple[str, ...] = ()  # generated tokens, a counter
    prompt_tokens: tuple[str, ...] = ()  # prompt tokens processed (cached ones excluded), a counter
    max_sequence: tuple[str, ...] = ()  # the longest sequence (prompt + output) seen so far, in tokens

    def __post_init__(self) -> None:
        if not self.waiting:
            raise ValueError(f"adapter {self.name!r} needs a queue gauge: the rules cannot read a server without one")

    def first_present(self, names: tuple[str, ...], present: Collection[str]) -> str | None:
        return next((n for n in names if n in present), None)

    def matches(self, present: Collection[str]) -> bool:
        return self.first_present(self.waiting, present) is not None

    def num_present(self, present: Collection[str]) -> int:
        kv, batch = self.kv_tokens or (), self.batch_per_step or ()
        return sum(n in present for n in (*self.running, *self.waiting, *self.kv_usage, *kv, *self.preemptions,
                                          *self.finished, *batch, *self.output_tokens, *self.prompt_tokens,
                                          *self.max_sequence))


ADAPTERS: dict[str, MetricAdapter] = {}


def register(adapter: MetricAdapter) -> MetricAdapter:
    if adapter.name in ADAPTERS:
        raise ValueError(f"a metric adapter named {adapter.name!r} is already registered")
    ADAPTERS[adapter.name] = adapter
    return adapter


def adapter_for(present: Collection[str]) -> MetricAdapter | None:
    """The registered adapter whose queue gauge is among the sample names ``present`` (most names found wins)."""
    matching = [a for a in ADAPTERS.values() if a.matches(present)]
    return max(matching, key=lambda a: a.num_present(present)) if matching else None


def get_adapter(name: str) -> MetricAdapter:
    if name not in ADAPTERS:
        raise ValueError(f"no metric adapter named {name!r}; registered: {sorted(ADAPTERS)}")
    return ADAPTERS[name]


# vllm/v1/metrics/loggers.py (PrometheusStatLogger); gpu_cache_usage_perc and the v0 names are the
# deprecated spellings older releases export. Labels: model_name, engine (one set per engine core).
VLLM = register(MetricAdapter(
    name="vllm",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    preemptions=("vllm:num_preemptions_total",),
    finished=("vllm:request_success_total",),
))

# python/sglang/srt/metrics/collector.py: SchedulerMetricsCollector (token_usage = used tokens over
# the KV pool's max_total_num_tokens; a retraction is SGLang's preemption) and
# TokenizerMetricsCollector (num_requests_total counts finished requests). Labels carry the ranks.
SGLANG = register(MetricAdapter(
    name="sglang",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    preemptions=("sglang:num_retracted_requests_total",),
    finished=("sglang:num_requests_total",),
))

# backends/v3/src/{backend,queue,lib}.rs and router/src/server.rs: the queue's length, the running
# batch's size, the tokens the running batch may grow to against the KV token pool found at warm-up
# (tgi_batch_max_total_tokens). TGI does not preempt. It writes the success counter without _total.
TGI = register(MetricAdapter(
    name="tgi",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    kv_tokens=("tgi_batch_current_max_tokens", "tgi_batch_max_total_tokens"),
    finished=("tgi_request_success_total",),
))

# tools/server/server-task.cpp (server_task_result_metrics::to_metrics; server.cpp in older trees):
# requests in a slot and requests deferred for want of one (gauges of the moment); busy slots per
# llama_decode() call averaged since the start, beside the decode-call counter; generated and prompt
# token counters; n_tokens_max, the longest sequence so far (typed a counter, so parsed as
# ``..._total``). kv_cache_usage_ratio (used cells / n_ctx) is only in older builds: current ones
# export no KV gauge. llama.cpp has no preemption and no finished-request counter.
LLAMACPP = register(MetricAdapter(
    name="llamacpp",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    kv_usage=("llamacpp:kv_cache_usage_ratio",),
    batch_per_step=("llamacpp:n_busy_slots_per_decode", "llamacpp:n_decode_total"),
    output_tokens=("llamacpp:tokens_predicted_total",),
    prompt_tokens=("llamacpp:prompt_tokens_total",),
    max_sequence=("llamacpp:n_tokens_max_total", "llamacpp:n_tokens_max"),
))


@dataclass(slots=True)
class PrometheusMeasures:
    """An OpenAI-compatible server's own gauges and counters over the window, read by its family's adapter."""

    num_scrapes: int
    mean_running: float | None
    mean_waiting: float | None
    waiting_share: float | None  # share of scrapes with requests waiting
    kv_usage_mean: float | None
    kv_usage_peak: float | None
    num_preemptions: int | None
    adapter: str = "vllm"  # the server family whose names were read (reports.metric_adapters)
    names: dict[str, str | None] = dataclasses.field(default_factory=dict)  # signal -> the sample read
    # Where the server counts them (llama.cpp): sequences per forward step over the window, generated and
    # prompt tokens per second of the window by its own counters, and the longest sequence it has held.
    mean_batch: float | None = None
    output_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    max_sequence_tokens: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def metrics_adapter(data: RunDataset) -> MetricAdapter | None:
    """The adapter for the names this run's ``/metrics`` scrapes hold; None without scrapes or known names."""
    if not data.has_prometheus:
        return None
    return adapter_for(set(data.frame("prometheus")["sample"].unique()))


def prometheus_series(data: RunDataset, sample: str, how: Literal["sum", "mean"] = "sum",
                      fill: float | None = None) -> pd.Series | None:
    """One value per scrape inside the window for ``sample`` (its label sets summed, or averaged with
    ``how="mean"``), by scrape time; with ``fill``, every scrape without the sample gets that value."""
    frame = data.frame("prometheus")
    start, end = data.window
    if math.isfinite(start) and math.isfinite(end):
        inside = frame[(frame["time"] >= start) & (frame["time"] <= end)]
        frame = inside if len(inside) else frame
    rows = frame[frame["sample"] == sample]
    if rows.empty:
        return None
    series = rows.groupby("time")["value"].agg(how).sort_index()
    return series if fill is None else series.reindex(np.sort(frame["time"].unique()), fill_value=fill)


def signal_series(data: RunDataset, adapter: MetricAdapter, signal: str) -> tuple[str | None, pd.Series | None]:
    """``(sample name read, series)`` of one of the adapter's SIGNALS; KV usage as a 0..1 share.

    NOTE: a labelled counter has no sample until its first increment (SGLang's retractions), so a
    scrape without it counts 0.
    """
    if signal not in SIGNALS:
        raise ValueError(f"unknown signal {signal!r}; known: {SIGNALS}")
    present = set(data.frame("prometheus")["sample"].unique())
    if signal == "kv_usage" and adapter.kv_tokens is not None and all(n in present for n in adapter.kv_tokens):
        used, capacity = (prometheus_series(data, n) for n in adapter.kv_tokens)
        if used is None or capacity is None:
            return None, None
        ratio = (used / capacity.reindex(used.index).replace(0.0, np.nan)).dropna()
        return "/".join(adapter.kv_tokens), (ratio if len(ratio) else None)
    name = adapter.first_present(getattr(adapter, signal), present)
    if name is None:
        return None, None
    if signal == "kv_usage":
        return name, prometheus_series(data, name, how="mean")
    return name, prometheus_series(data, name, fill=0.0 if signal in ("preemptions", "finished") else None)


def prometheus_measures(data: RunDataset) -> PrometheusMeasures | None:
    """The server's gauges over the window; None when there are no scrapes or no adapter knows their names."""
    adapter = metrics_adapter(data)
    if adapter is None:
        return None
    read = {signal: signal_series(data, adapter, signal) for signal in SIGNALS}
    running, waiting, usage, preempt = (read[s][1] for s in ("running", "waiting", "kv_usage", "preemptions"))
    return PrometheusMeasures(
        num_scrapes=int(data.frame("prometheus")["scrape_index"].nunique()),
        mean_running=float(running.mean()) if running is not None else None,
        mean_waiting=float(waiting.mean()) if waiting is not None else None,
        waiting_share=float((waiting > 0).mean()) if waiting is not None else None,
        kv_usage_mean=float(usage.mean()) if usage is not None else None,
        kv_usage_peak=float(usage.max()) if usage is not None else None,
        num_preemptions=int(round(preempt.iloc[-1] - preempt.iloc[0])) if preempt is not None else None,
        adapter=adapter.name, names={signal: name for signal, (name, _) in read.items()},
        **_server_counters(data, adapter),
    )


def _server_counters(data: RunDataset, adapter: MetricAdapter) -> dict[str, float | None]:
    """The adapter's step and token counters over the window (see PrometheusMeasures), each None when absent."""
    present = set(data.frame("prometheus")["sample"].unique())
    out: dict[str, float | None] = {}

    def rate(names: tuple[str, ...]) -> float | None:
        name = adapter.first_present(names, present)
        series = prometheus_series(data, name) if name is not None else None
        if series is None or len(series) < 2 or series.index[-1] <= series.index[0]:
            return None
        return float(series.iloc[-1] - series.iloc[0]) / float(series.index[-1] - series.index[0])

    out["output_tokens_per_s"] = rate(adapter.output_tokens)
    out["prompt_tokens_per_s"] = rate(adapter.prompt_tokens)
    longest = adapter.first_present(adapter.max_sequence, present)
    series = prometheus_series(data, longest) if longest is not None else None
    out["max_sequence_tokens"] = float(series.max()) if series is not None else None
    if adapter.batch_per_step is not None and all(n in present for n in adapter.batch_per_step):
        per_step, steps = (prometheus_series(data, n) for n in adapter.batch_per_step)
        if per_step is not None and steps is not None and len(steps) >= 2:
            busy = (per_step * steps.reindex(per_step.index)).dropna()
            num_steps = float(steps.iloc[-1] - steps.iloc[0])
            out["mean_batch"] = float(busy.iloc[-1] - busy.iloc[0]) / num_steps if num_steps > 0 and len(busy) >= 2 \
                else None
    return out


def finished_requests(data: RunDataset) -> int | None:
    """How many requests the server's own counter says finished over the whole run (warm-up included);
    None without scrapes, a known adapter or a finished counter."""
    adapter = metrics_adapter(data)
    if adapter is None:
        return None
    present = set(data.frame("prometheus")["sample"].unique())
    counter = adapter.first_present(adapter.finished, present)
    return _counter_growth(data.frame("prometheus"), counter) if counter is not None else None


def _counter_growth(frame: pd.DataFrame, sample: str) -> int | None:
    """How much counter ``sample`` (summed over labels) grew from the first scrape to the last.

    NOTE: a labelled counter has no sample until its first increment, so a scrape without it counts 0.
    """
    rows = frame[frame["sample"] == sample]
    if rows.empty:
        return None
    scrapes = sorted(frame["scrape_index"].unique())
    per_scrape = rows.groupby("scrape_index")["value"].sum().reindex(scrapes, fill_value=0.0)
    return int(round(per_scrape.iloc[-1] - per_scrape.iloc[0]))
