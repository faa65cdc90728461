"""What to try first for each verdict: the lever for its bottleneck, worded from the run's own figures and settings."""

from __future__ import annotations

from reports.measures import LIMIT_BUDGET, LIMIT_CAP, LIMIT_IDLE
from reports.verdict.capacity_rules import capacity_lever
from reports.verdict.engine_rules import NO_QUEUE_SHARE, QUEUE_SHARE
from reports.verdict.evidence import Bottleneck, Evidence, Facts, num, pct
from reports.verdict.external_rules import QUEUE_DEPTH, ServerQueueDepth
from reports.verdict.overload_rules import SLOTS_BUSY, overload_lever


def lever_for(bottleneck: Bottleneck, facts: Facts, deciding: list[Evidence]) -> tuple[str, str]:
    """``(lever to try, one-sentence summary)`` for a verdict."""
    from_capacity = capacity_lever(deciding, facts) or overload_lever(deciding, facts)
    if from_capacity is not None:
        return from_capacity
    names = {e.name for e in deciding}
    config = facts.engine_config
    s = facts.server
    if bottleneck == "batching":
        if s is not None:
            top = max((LIMIT_CAP, LIMIT_BUDGET, LIMIT_IDLE), key=lambda k: s.wait_limits[k])
            if top == LIMIT_CAP:
                room = f" (the KV pool holds about {num(s.kv_capacity_seqs)})" if s.kv_capacity_seqs else ""
                return (f"raise max_num_seqs above {config.get('max_num_seqs')}{room}",
                        f"requests queue behind the max_num_seqs cap of {config.get('max_num_seqs')} while memory "
                        f"has room")
            if top == LIMIT_BUDGET:
                return (f"raise max_num_batched_tokens above {config.get('max_num_batched_tokens')}",
                        "requests queue while each step's token budget is spent")
            return ("use continuous batching: admit waiting requests into the running batch every step",
                    f"requests queue while the batch runs {num(s.mean_batch)} sequences with seats and memory free: "
                    f"the server does not batch them")
        slots = _busy_slots(facts)
        if slots is not None:
            p = facts.prometheus
            waiting = p.mean_waiting if p is not None and p.mean_waiting is not None else 0.0
            return (f"more slots: llama-server -np {2 * slots} (--parallel; {slots} now), with -c grown to keep each "
                    f"slot's context",
                    f"every one of its {slots} slots was busy and {num(waiting)} requests on average waited for one "
                    f"(requests_deferred): llama-server defers a request only when no slot is free, so the slot "
                    f"count holds it")
        if "sweep_throughput_flat" in names:
            return ("enable or widen batching on the server (its max batch size / max_num_seqs)",
                    "more concurrency did not become more throughput: requests are queued, not batched")
        if "server_kv_room" not in names:
            return ("check the server's batch limit (max_num_seqs / max batch size / parallel slots)",
                    "requests wait in the server's queue; it exports no KV usage, so a batch limit is the likelier "
                    "hold but memory is not ruled out")
        return ("check the server's batch limit (max_num_seqs / max batch size)",
                "requests wait while the KV cache has room: a batch limit holds them")
    if bottleneck == "cache":
        if s is not None and s.kv_waste is not None and s.kv_waste >= 0.4:
            return ("use the paged KV layout (kv_layout=paged): it reserves blocks as tokens arrive, not max length",
                    f"the KV pool is full while {pct(s.kv_waste)} of the slots it hands out stay empty")
        return ("give the KV cache more memory (kv_cache_mb / num_kv_blocks), or lower max_num_seqs so fewer "
                "requests are preempted",
                "active request state fills the KV pool: requests wait for blocks or are preempted")
    if bottleneck == "execution":
        return _execution_lever(facts, deciding)
    if s is not None and s.busy_fraction <= 0.5:
        return ("offer more load (more users or a higher rate) to find the server's limit",
                f"the engine was idle {pct(1 - s.busy_fraction)} of the time: the offered load is the limit")
    more_load = "offer more load (more users or a higher rate) to find the server's limit"
    if is_undecided(bottleneck, facts):
        # NOTE: the fallback with a queue: no finding's rules all held, so nothing was shown to bind, but the
        # queue says the load is not the limit either; say so rather than claim nothing binds.
        return ("pull the lever predicted to gain most (the levers), then measure again",
                f"requests were waiting in {pct(s.waiting_share)} of the busy time and the engine was stepping "
                f"{pct(s.busy_fraction)} of the window, so the offered load is not the limit, but no bottleneck's "
                f"evidence was complete (see the evidence): which limit binds is undecided")
    if s is not None:
        return more_load, "every request was admitted and nothing inside the server binds: the offered load is the limit"
    return more_load, _outside_none_summary(facts)


def is_undecided(bottleneck: Bottleneck, facts: Facts) -> bool:
    """No limit named where our engine's requests queued: nothing was shown to bind, yet the offered load is not
    the limit either (the engine's facts only; a server seen from outside says what its queue gauge showed)."""
    s = facts.server
    return (bottleneck == "none" and s is not None and s.busy_fraction > 0.5 and s.waiting_share is not None
            and s.waiting_share > NO_QUEUE_SHARE)


def _busy_slots(facts: Facts) -> int | None:
    """The slot count of a server that reports one (llama-server's /props) when its slots were all busy."""
    info, p = facts.server_info, facts.prometheus
    slots = info.num_slots if info is not None else None
    if not slots or p is None or p.mean_running is None or p.mean_running < SLOTS_BUSY * slots:
        return None
    return slots


def _outside_none_summary(facts: Facts) -> str:
    """Why nothing binds, for a server seen from outside: only what its queue gauge showed, if it had one.

    NOTE: without a queue gauge nobody measured whether requests waited, so this never says they did not.
    """
    p = facts.prometheus
    if p is None or p.waiting_share is None:
        why = ("its /metrics names are not ones servescope reads" if facts.is_metrics_unread
               else "it had no /metrics scraped")
        return (f"the server's queue was not measured ({why}), so whether requests waited is unknown; "
                f"the client-side evidence shows no limit")
    gauge = p.names.get("waiting") or "queue gauge"
    if p.waiting_share <= NO_QUEUE_SHARE:
        return (f"requests were waiting in {pct(p.waiting_share)} of the scrapes ({gauge}): every request was "
                f"admitted and nothing inside the server binds: the offered load is the limit")
    if p.waiting_share < QUEUE_SHARE:
        return (f"requests were waiting in {pct(p.waiting_share)} of the scrapes ({gauge}), under the "
                f"{pct(QUEUE_SHARE)} that marks a sustained queue, and nothing inside the server binds")
    depth = ServerQueueDepth().value(facts)
    return (f"requests were waiting in {pct(p.waiting_share)} of the scrapes ({gauge}), but only {pct(depth)} of "
            f"the requests at the server on average, under the {pct(QUEUE_DEPTH)} that marks a limit: a queue "
            f"for the next step, not a limit; nothing inside the server binds")


def _execution_lever(facts: Facts, deciding: list[Evidence]) -> tuple[str, str]:
    """The execution lever, with the share of the step it would remove as the deciding evidence measured it."""
    by_name = {e.name: e for e in deciding}
    s = facts.server
    path = by_name.get("optimized_path_removes")
    if path is not None and facts.execution_paths is not None:
        p = facts.execution_paths
        return ("use the optimized execution path (--execution optimized): fused and prepacked GEMMs, reused "
                "buffers, CUDA graphs on a GPU",
                f"the optimized path would remove {pct(path.value)} of each decode step ({p.run_path} "
                f"{p.step_s[p.run_path] * 1000:.2f} ms -> {p.optimized_s * 1000:.2f} ms on the run's batch of "
                f"{p.batch}, calibrated side by side before the load)")
    busy = by_name.get("engine_busy")
    if busy is not None and "host_overhead" not in by_name:
        filled = by_name.get("batch_filled")
        return ("make each step cheaper: a lower-precision dtype, quantized weights, the optimized path or a faster "
                "device (each execution lever this device runs is timed on the model before the load and predicted "
                "below, with its accuracy cost)",
                f"the engine stepped {pct(busy.value)} of the window, its batch {pct(filled.value if filled else None)} "
                f"of what it allows, and nobody waited for a seat or for memory: the work itself saturates it")
    outside = by_name.get("slower_than_optimized")
    if outside is not None and facts.execution_reference is not None:
        ref = facts.execution_reference
        return ("speed up the server's execution path (fused kernels, CUDA graphs, less host work per step and per "
                "token, async output processing)",
                f"servescope's optimized path would remove {pct(outside.value)} of each decode step: it does the same "
                f"weights' step on this machine in {ref.optimized_s * 1000:.2f} ms at batch {ref.batch}, against "
                f"the server's {ref.step_s['target'] * 1000:.2f} ms, timed in turns by the same client")
    overhead = facts.engine_config.get("host_overhead_ms") or 0
    burnt = f"; --host-overhead-ms {overhead:g} adds that much per step" if overhead else ""
    return (f"cut per-step host work: the optimized execution path (fused kernels, CUDA graphs), async "
            f"scheduling{burnt}",
            f"the batch and memory are healthy but host-side work takes {pct(s.overhead_share if s else None)} "
            f"of each step: removing it would remove that share of the step")
