"""Prometheus metrics for ``/metrics``, named as vLLM names them so the same dashboards and scrapers work.

Gauges and cumulative counters are read from the engine's latest stats snapshot at scrape time;
latency histograms and token counters are fed per request by :class:`RequestTimer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.outputs import EngineStats, RequestOutput

# vLLM v1's bucket edges, so histograms from either server line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    """All of the server's metrics, in a registry of their own (never prometheus-client's global one).

    NOTE: prometheus-client's metric objects are thread-safe, so the engine thread observes them
    while the event loop renders them.
    """

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.",
                               labels, registry=self.registry, buckets=TTFT_BUCKETS).labels(model_name)
        self._itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.",
                              labels, registry=self.registry, buckets=ITL_BUCKETS).labels(model_name)
        self._e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.",
                              labels, registry=self.registry, buckets=E2E_BUCKETS).labels(model_name)
        self._prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                      labels, registry=self.registry).labels(model_name)
        self._generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                          labels, registry=self.registry).labels(model_name)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                [*labels, "finished_reason"], registry=self.registry)
        self._errors = Counter("servescope:request_errors", "Requests the engine failed (answered with an error).",
                               labels, registry=self.registry).labels(model_name)
        self._model_name = model_name
        self.registry.register(EngineStatsCollector(model_name, stats))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def timer(self, arrival: float) -> RequestTimer:
        """A per-request timer; ``arrival`` is a ``time.monotonic()`` reading."""
        return RequestTimer(self, arrival)

    def observe_first_token(self, seconds: float, num_prompt_tokens: int) -> None:
        """A request's first token, ``seconds`` after it arrived; its prompt counts as prefilled."""
        self._ttft.observe(seconds)
        self._prompt_tokens.inc(num_prompt_tokens)

    def observe_tokens(self, num_tokens: int, gap_s: float | None) -> None:
        """``num_tokens`` generated ``gap_s`` after the request's previous ones (None: no previous)."""
        self._generation_tokens.inc(num_tokens)
        if gap_s is not None:
            # NOTE: an engine that hands over several tokens at once (a baseline) gets the gap spread
            # evenly over them, one observation per token, so counts match generation_tokens.
            for _ in range(num_tokens):
                self._itl.observe(gap_s / num_tokens)

    def observe_finished(self, seconds: float, finish_reason: str | None) -> None:
        """A request that finished ``seconds`` after it arrived."""
        self._e2e.observe(seconds)
        if finish_reason == "error":
            self._errors.inc()
        else:
            self._success.labels(self._model_name, finish_reason or "unknown").inc()


class RequestTimer:
    """Turns one request's outputs, as the engine thread sees them, into latency observations."""

    def __init__(self, metrics: ServerMetrics, arrival: float) -> None:
        self._metrics = metrics
        self._arrival = arrival
        self._last: float | None = None

    def on_output(self, now: float, output: RequestOutput) -> None:
        """Record an output produced at ``now`` (``time.monotonic()``)."""
        num_new = len(output.new_token_ids)
        if num_new:
            if self._last is None:
                self._metrics.observe_first_token(now - self._arrival, len(output.prompt_token_ids))
                self._metrics.observe_tokens(1, None)
                if num_new > 1:
                    self._metrics.observe_tokens(num_new - 1, 0.0)
            else:
                self._metrics.observe_tokens(num_new, now - self._last)
            self._last = now
        if output.finished:
            self._metrics.observe_finished(now - self._arrival, output.finish_reason)


class EngineStatsCollector(Collector):
    """Gauges and cumulative counters read from the engine's stats at scrape time."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self._model_name = model_name
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        label = [self._model_name]
        gauges = (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", stats.num_running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage),
            ("servescope:num_kv_blocks", "KV blocks in the pool.", stats.num_kv_blocks),
            ("servescope:num_kv_blocks_free", "KV blocks with no reference.", stats.num_kv_blocks_free),
            ("servescope:num_kv_blocks_cached", "Free KV blocks that still hold a reusable prefix.",
             stats.num_kv_blocks_cached),
            ("servescope:num_kv_slots_allocated", "KV token slots held by running requests.",
             stats.num_kv_slots_allocated),
            ("servescope:num_kv_slots_used", "Of the slots held, those holding a computed token.",
             stats.num_kv_slots_used),
        )
        for name, documentation, value in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
            gauge.add_metric(label, value)
            yield gauge
        counters = (
            ("vllm:num_preemptions", "Cumulative number of preemptions.", stats.num_preemptions_total),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", stats.num_prefix_query_tokens),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", stats.num_prefix_hit_tokens),
            ("servescope:engine_steps", "Engine steps run.", stats.num_steps),
        )
        for name, documentation, value in counters:
            counter = CounterMetricFamily(name, documentation, labels=["model_name"])
            counter.add_metric(label, value)
            yield counter
