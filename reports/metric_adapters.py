"""Which of a server's own ``/metrics`` samples carry the signals the external rules read.

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

from collections.abc import Collection
from dataclasses import dataclass

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
