"""Rules for servers seen from outside: the client's timings, the server's ``/metrics``, a concurrency sweep.

Without step rows the queue looks the same whichever limit holds it; the server's own KV gauge
and preemption counter tell the two apart, and a sweep shows whether more users become more
throughput. A queue gauge is read between steps, so a request that arrived during a step shows as
waiting until the next one admits it: a queue counts only when it is sustained (in many scrapes)
and deep (a real share of the requests at the server). Execution has no step timer from outside;
it is told from the server's time per output token against ``servescope serve``'s on the same
weights and batch, timed in turns by the same client on this machine (``execution_reference.json``),
when servescope can load the served weights.
"""

from __future__ import annotations

from probes.execution_paths import TARGET
from reports.verdict.engine_rules import (
    KV_FULL,
    NO_QUEUE_SHARE,
    PATH_SHARE,
    PREEMPTIONS_PER_REQUEST,
    QUEUE_SHARE,
)
from reports.verdict.evidence import Facts, Rule, num, pct

MIN_IN_FLIGHT = 2.0
DECODING_SHARE = 0.5
SWEEP_MIN_LOAD_RATIO = 3.0
FLAT_THROUGHPUT_RATIO = 1.5
TTFT_GROWTH_RATIO = 3.0
TPOT_HOLD_RATIO = 1.5
QUEUE_DEPTH = 0.2


class ServerQueue(Rule):
    name = "server_queue"
    bottleneck = "batching"
    threshold = QUEUE_SHARE
    why = ("The server's queue gauge (vLLM num_requests_waiting, SGLang num_queue_reqs, TGI tgi_queue_size, llama.cpp "
           "requests_deferred) above zero in at least 30% of the scrapes: a sustained queue, not a burst; the KV "
           "rules below say whether memory or the batch limit holds it.")

    def value(self, facts: Facts) -> float | None:
        return facts.prometheus.waiting_share if facts.prometheus else None

    def describe(self, facts: Facts, value: float | None) -> str:
        p = facts.prometheus
        return (f"requests were waiting in {pct(value)} of the scrapes (mean {num(p.mean_waiting if p else None)} "
                f"waiting, {num(p.mean_running if p else None)} running)")


class ServerQueueDepth(Rule):
    name = "server_queue_depth"
    bottleneck = "batching"
    threshold = QUEUE_DEPTH
    why = ("Of the requests at the server (waiting + running, averaged over the scrapes), at least a fifth waiting. "
           "A closed-loop client's next request arrives while a step runs and waits for the next step: that "
           "queue is about one request against a full batch (well under a tenth), gone a step later. A limit "
           "keeps a share of the requests out of the batch for as long as the load lasts.")

    def value(self, facts: Facts) -> float | None:
        p = facts.prometheus
        if p is None or p.mean_waiting is None or p.mean_running is None:
            return None
        open_requests = p.mean_waiting + p.mean_running
        return p.mean_waiting / open_requests if open_requests > 0 else 0.0

    def describe(self, facts: Facts, value: float | None) -> str:
        p = facts.prometheus
        return (f"{pct(value)} of the requests at the server were waiting (mean {num(p.mean_waiting if p else None)} "
                f"waiting, {num(p.mean_running if p else None)} running)")


class ServerQueueAbsent(Rule):
    name = "server_queue_absent"
    bottleneck = "none"
    threshold = NO_QUEUE_SHARE
    comparison = "<="
    why = "As queue_absent, from the server's queue gauge."

    def value(self, facts: Facts) -> float | None:
        return facts.prometheus.waiting_share if facts.prometheus else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"requests were waiting in {pct(value)} of the scrapes"


class ServerKvFull(Rule):
    name = "server_kv_full"
    bottleneck = "cache"
    threshold = KV_FULL
    why = ("The server's KV-cache usage (vLLM kv_cache_usage_perc, SGLang token_usage, TGI's batch tokens over its "
           "token pool, llama.cpp kv_cache_usage_ratio) at 90% or more while requests wait: the queue is held by "
           "memory, not by the batch limit.")

    def value(self, facts: Facts) -> float | None:
        return facts.prometheus.kv_usage_peak if facts.prometheus else None

    def describe(self, facts: Facts, value: float | None) -> str:
        p = facts.prometheus
        return f"KV cache usage peaked at {pct(value)} (mean {pct(p.kv_usage_mean if p else None)})"


class ServerKvRoom(Rule):
    name = "server_kv_room"
    bottleneck = "batching"
    threshold = KV_FULL
    comparison = "<="
    why = ("Requests wait while the KV cache never came near full: memory was not what kept them out of the "
           "batch, so a batch limit (max_num_seqs, the token budget, a server that does not batch) did.")

    def value(self, facts: Facts) -> float | None:
        return facts.prometheus.kv_usage_peak if facts.prometheus else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"KV cache usage peaked at {pct(value)}"


class ServerPreemptions(Rule):
    name = "server_preemptions"
    bottleneck = "cache"
    threshold = PREEMPTIONS_PER_REQUEST
    why = ("As preemptions, from the server's preemption counter (vLLM num_preemptions, SGLang "
           "num_retracted_requests) over the measured requests.")

    def value(self, facts: Facts) -> float | None:
        p, c = facts.prometheus, facts.client
        if p is None or p.num_preemptions is None or c is None or not c.num_requests:
            return None
        return p.num_preemptions / c.num_requests

    def describe(self, facts: Facts, value: float | None) -> str:
        p = facts.prometheus
        return f"{p.num_preemptions if p else 'n/a'} preemptions, {num(value)} per request"


class FewStreamsDecoding(Rule):
    name = "few_streams_decoding"
    bottleneck = "batching"
    threshold = DECODING_SHARE
    comparison = "<="
    why = ("Little's law gives the requests open at once (sum of E2E / window); output tokens/s x TPOT gives the "
           "streams decoding at once. If at most half of the open requests are decoding, the rest sit in a queue "
           "before their first token. From the client alone the queue's cause is unknown, so this is weak evidence.")

    def value(self, facts: Facts) -> float | None:
        c = facts.client
        if c is None or c.in_flight is None or c.decoding_streams is None or c.in_flight < MIN_IN_FLIGHT:
            return None
        return c.decoding_streams / c.in_flight

    def describe(self, facts: Facts, value: float | None) -> str:
        c = facts.client
        return (f"{num(c.decoding_streams if c else None)} streams decoding of {num(c.in_flight if c else None)} "
                f"requests open ({pct(value)})")


class _SweepRule(Rule):
    def value(self, facts: Facts) -> float | None:
        sweep = facts.sweep
        if sweep is None or sweep.load_ratio < SWEEP_MIN_LOAD_RATIO:
            return None
        return self.ratio(facts)

    def ratio(self, facts: Facts) -> float | None:
        raise NotImplementedError


class SweepThroughputFlat(_SweepRule):
    name = "sweep_throughput_flat"
    bottleneck = "batching"
    threshold = FLAT_THROUGHPUT_RATIO
    comparison = "<="
    why = ("A batching server turns more concurrency into more throughput until its batch fills; with at least "
           "3x the load and under 1.5x the throughput, the extra requests were not joined to the running batch.")

    def ratio(self, facts: Facts) -> float | None:
        return facts.sweep.throughput_ratio if facts.sweep else None

    def describe(self, facts: Facts, value: float | None) -> str:
        s = facts.sweep
        return f"output throughput x{num(value)} from {s.parameter} {num(s.low)} to {num(s.high)}" if s else "no sweep"


class SweepTtftGrows(_SweepRule):
    name = "sweep_ttft_grows"
    bottleneck = "batching"
    threshold = TTFT_GROWTH_RATIO
    why = "Median TTFT at least 3x higher at the heaviest point: the added requests queued before their first token."

    def ratio(self, facts: Facts) -> float | None:
        return facts.sweep.ttft_ratio if facts.sweep else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"median TTFT x{num(value)} across the sweep"


class SweepTpotHolds(_SweepRule):
    name = "sweep_tpot_holds"
    bottleneck = "batching"
    threshold = TPOT_HOLD_RATIO
    comparison = "<="
    why = ("Median TPOT within 1.5x across the sweep: each request decoded about as fast as alone, so it did not "
           "share its steps with others (a batch makes each step longer).")

    def ratio(self, facts: Facts) -> float | None:
        return facts.sweep.tpot_ratio if facts.sweep else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"median TPOT x{num(value)} across the sweep"


class SlowerThanOptimized(Rule):
    name = "slower_than_optimized"
    bottleneck = "execution"
    threshold = PATH_SHARE
    why = ("Time per output token is the server's decode step as its clients feel it. After the load, the server "
           "and `servescope serve` (its optimized path) on the same weights were timed in turns by the same client "
           "on this machine, at the batch the client saw decoding, so both carry the same HTTP and streaming work "
           "and a busy machine slows both alike: when servescope's step takes at least 30% less time, the server's "
           "execution (its kernels, its host work per step and per token) holds each step back. Unknown when "
           "servescope cannot load the served weights or the target runs elsewhere.")

    def value(self, facts: Facts) -> float | None:
        ref = facts.execution_reference
        if ref is None or TARGET not in ref.step_s:
            return None
        return ref.share_removed(ref.step_s[TARGET])

    def describe(self, facts: Facts, value: float | None) -> str:
        ref = facts.execution_reference
        if ref is None or TARGET not in ref.step_s:
            return "no reference: the served model or the target's machine is not one servescope can time"
        return (f"the server's decode step took {ref.step_s[TARGET] * 1000:.2f} ms (time per token after the first, "
                f"{ref.batch} streams of {ref.context} tokens) and servescope's optimized path "
                f"{ref.optimized_s * 1000:.2f} ms on {ref.model} ({ref.method}): it would remove "
                f"{pct(value)} of the step")
