"""Rules that read a capacity search's experiments (reports.capacity.limit): what holds the server at its capacity.

They speak only after a capacity search (``Facts.capacity``), and decide only when no direct
evidence (engine probes, the server's own gauges) has: the experiments are causal but coarse.
"""

from __future__ import annotations

from reports.capacity.limit import SERIAL_GAIN, SERIAL_MAX_STREAMS, UNQUEUED_DECODING_SHARE, is_compute
from reports.verdict.evidence import Evidence, Facts, Rule, num, pct

# The tokens experiment's exponent: 0 when the decoding streams hold their count, 1 when they fall in
# proportion to the tokens per request; halfway between decides.
TOKENS_EXPONENT = 0.5


class CapacitySerial(Rule):
    name = "capacity_serial"
    bottleneck = "batching"
    threshold = SERIAL_GAIN
    comparison = "<="
    why = ("a server that batches serves several users faster than one; one that does not stays flat however many "
           "users the search tried")

    def value(self, facts: Facts) -> float | None:
        return facts.capacity.serial_gain if facts.capacity is not None else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"output throughput grew at most {num(value)}x from 1 user to any heavier point"


class CapacityOneStream(Rule):
    name = "capacity_one_stream"
    bottleneck = "batching"
    threshold = SERIAL_MAX_STREAMS
    comparison = "<="
    why = ("a serial server decodes one request at a time, so the client never sees two streams decoding at once; "
           "one that streams two or more at once batches them, and what keeps its throughput flat is something "
           "else (seats or memory: the tokens experiment tells)")

    def value(self, facts: Facts) -> float | None:
        return facts.capacity.max_decoding_streams if facts.capacity is not None else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"at most {num(value)} streams decoded at once (time-averaged) at any point of the search"


class _TokensRule(Rule):
    threshold = TOKENS_EXPONENT
    why = ("the capacity point rerun with more tokens per request: streams that fall in proportion (exponent 1) "
           "are held by memory, streams that keep their count (exponent 0) by a seat limit")

    def value(self, facts: Facts) -> float | None:
        c = facts.capacity
        return c.tokens.exponent if c is not None and c.tokens is not None else None

    def describe(self, facts: Facts, value: float | None) -> str:
        t = facts.capacity.tokens if facts.capacity is not None else None
        if t is None:
            return "no tokens experiment"
        return (f"{num(t.token_ratio)}x the tokens per request gave {num(t.streams_ratio)}x the decoding streams "
                f"at {t.users} users (exponent {num(value)})")


class CapacityMemory(_TokensRule):
    name = "capacity_memory"
    bottleneck = "cache"
    comparison = ">="


class CapacitySeats(_TokensRule):
    name = "capacity_seats"
    bottleneck = "batching"
    comparison = "<="

    def value(self, facts: Facts) -> float | None:
        # NOTE: past a compute reading (every open request decoding past the capacity), a seat limit found at a
        # heavier point binds only after the device is full: compute stands (reports.capacity.limit.capacity_limit).
        if facts.capacity is not None and is_compute(facts.capacity):
            return None
        return super().value(facts)


class CapacityCompute(Rule):
    name = "capacity_compute"
    bottleneck = "execution"
    threshold = UNQUEUED_DECODING_SHARE
    why = ("past the capacity, open requests that are all decoding (time-averaged: first token to end, against "
           "send to end) were not queued for seats or memory: each got slower, so the work itself saturates the "
           "device")

    def value(self, facts: Facts) -> float | None:
        return facts.capacity.queue_share_past_knee if facts.capacity is not None else None

    def describe(self, facts: Facts, value: float | None) -> str:
        users = facts.capacity.past_knee_users if facts.capacity is not None else None
        return f"{pct(value)} of the open requests were decoding at {users} users, past the capacity"


def capacity_lever(deciding: list[Evidence], facts: Facts) -> tuple[str, str] | None:
    """``(lever, summary)`` when a capacity rule made the verdict, else None."""
    names = {e.name for e in deciding}
    c = facts.capacity
    if c is None:
        return None
    at = f"{c.concurrency} users" if c.concurrency is not None else "its capacity"
    if "capacity_serial" in names:
        return ("serve requests concurrently: continuous batching, or more parallel slots",
                f"the server does not batch: no number of users added more than {pct((c.serial_gain or 1) - 1)} "
                f"throughput over one")
    if "capacity_memory" in names:
        at = f"{c.tokens.users} users" if c.tokens is not None else at
        return ("give the KV cache more memory, or quantize the KV cache, so more requests fit at once",
                f"at {at}, longer requests cut the streams decoding at once in proportion: memory holds them")
    if "capacity_seats" in names:
        return ("raise the server's limit on running sequences (max_num_seqs / max batch size / parallel slots)",
                f"at {at}, longer requests kept the same number of streams decoding: a seat limit holds them")
    if "capacity_compute" in names:
        return ("make each step cheaper (the optimized execution path, quantized weights, a faster device) or "
                "add replicas: more batching cannot help here",
                f"past {at} every open request decodes and each gets slower: the work saturates the device")
    return None
