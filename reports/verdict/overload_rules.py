"""Rules that read a server from outside when the load pressed it: how its requests failed, and how much
slower each stream ran than one stream alone.

A server that drops, refuses or times out requests only under load has run out of seats (slots,
sequences, its queue): batching. One that fails them for want of context or KV cache has run out of
memory: cache. Which failures were overload and which a broken run is reports.failures' and
reports.health's call; these rules read a point already judged.

Compute saturation from outside: every request decoding (nothing deferred, the slots busy) and each
stream at least ``SATURATED_TPOT_RATIO`` times slower than one stream alone in the same run: the work
of the batch itself fills the device, and only a cheaper step (or more devices) serves more.

What a server says of its own slots backs a seat limit up: llama-server's slot count (``/props``) against
its requests in a slot, and its per-request timings (the wait before it began the prompt).
"""

from __future__ import annotations

from reports.failures import KIND_WORDS
from reports.verdict.evidence import Evidence, Facts, Rule, num, pct

# A share of the point's requests failing from one kind of overload that is no accident.
OVERLOAD_SHARE = 0.05
SEAT_KINDS = ("dropped", "refused_busy", "timed_out")
MEMORY_KINDS = ("context_full",)
# Each stream at least this many times slower than alone: the batch has taken the device.
SATURATED_TPOT_RATIO = 2.0
# Of the requests open at once, at least this share decoding: none wait for a seat.
ALL_DECODING_SHARE = 0.8
# The server's requests in a slot over its slot count, averaged over the scrapes: every slot busy.
SLOTS_BUSY = 0.9


class _OverloadRule(Rule):
    kinds: tuple[str, ...] = ()
    threshold = OVERLOAD_SHARE

    def value(self, facts: Facts) -> float | None:
        f = facts.failures
        return f.share(*self.kinds) if f is not None and f.num_requests else None

    def describe(self, facts: Facts, value: float | None) -> str:
        f = facts.failures
        if f is None:
            return "no client rows"
        found = [f"{f.by_kind[k]} {KIND_WORDS[k]}" for k in self.kinds if f.by_kind.get(k)]
        return f"{pct(value)} of {f.num_requests} requests failed this way" + (f": {', '.join(found)}" if found else "")


class OverloadRefused(_OverloadRule):
    name = "overload_refused"
    bottleneck = "batching"
    kinds = SEAT_KINDS
    why = ("Requests dropped, refused as busy (HTTP 429/503) or timed out at a load a lighter one served without "
           "them: the server had no seat for them (its slots, sequences or queue were full), so more seats, or a "
           "longer queue, is the lever.")


class OverloadContext(_OverloadRule):
    name = "overload_context"
    bottleneck = "cache"
    kinds = MEMORY_KINDS
    why = ("Requests failed for want of context or KV cache (llama-server's \"Context size has been exceeded\" when "
           "its unified pool fills, a KV allocation failure) at a load a lighter one served without them: the "
           "requests at once outgrew the server's cache, so memory for it is the lever.")


class TpotOverSingleStream(Rule):
    name = "tpot_over_single_stream"
    bottleneck = "execution"
    threshold = SATURATED_TPOT_RATIO
    why = ("Median TPOT at this load over one stream's alone in the same run (a capacity search's 1-user point, or "
           "the reference a one-point run takes after its load): each stream at least twice as slow as alone, "
           "with nothing waiting, means the batch's own work fills the device.")

    def value(self, facts: Facts) -> float | None:
        c, alone = facts.client, facts.single_stream_tpot_s
        if c is None or not c.tpot_s or not alone:
            return None
        return c.tpot_s["p50"] / alone

    def describe(self, facts: Facts, value: float | None) -> str:
        c, alone = facts.client, facts.single_stream_tpot_s
        if value is None or c is None or not c.tpot_s or not alone:
            return "no single-stream TPOT in this run to compare with"
        return (f"median TPOT {c.tpot_s['p50'] * 1000:.1f} ms at this load against {alone * 1000:.1f} ms for one "
                f"stream alone: x{num(value)}")


class StreamsAllDecoding(Rule):
    name = "streams_all_decoding"
    bottleneck = "execution"
    threshold = ALL_DECODING_SHARE
    why = ("Of the requests open at once (Little's law), at least 80% decoding (output tok/s x TPOT): none waited "
           "long for a seat before its first token, so what slows them is the decoding itself.")

    def value(self, facts: Facts) -> float | None:
        c = facts.client
        if c is None or c.in_flight is None or c.decoding_streams is None or not c.in_flight:
            return None
        return c.decoding_streams / c.in_flight

    def describe(self, facts: Facts, value: float | None) -> str:
        c = facts.client
        return (f"{num(c.decoding_streams if c else None)} streams decoding of {num(c.in_flight if c else None)} "
                f"requests open ({pct(value)})")


class ServerSlotsBusy(Rule):
    name = "server_slots_busy"
    bottleneck = "batching"
    threshold = SLOTS_BUSY
    why = ("The server's requests in a slot (llama.cpp requests_processing) against the slots it has (/props "
           "total_slots), averaged over the scrapes: at 90% or more every slot was busy, so a request that came "
           "then had to wait, or be turned away.")

    def value(self, facts: Facts) -> float | None:
        p, info = facts.prometheus, facts.server_info
        slots = info.num_slots if info is not None else None
        if p is None or p.mean_running is None or not slots:
            return None
        return p.mean_running / slots

    def describe(self, facts: Facts, value: float | None) -> str:
        p, info = facts.prometheus, facts.server_info
        if value is None or p is None or info is None:
            return "the server reports no slot count"
        return (f"{num(p.mean_running)} of its {info.num_slots} slots busy on average ({pct(value)}), "
                f"{num(p.mean_waiting)} requests deferred")


class ServerWaitBeforePrompt(Rule):
    name = "server_wait_before_prompt"
    bottleneck = "batching"
    threshold = 0.5
    why = ("The server's own timings (llama.cpp's ``timings`` in each stream's last chunk) say how long it spent on "
           "the prompt; the rest of the time to first token the request waited before the server began it (for a "
           "slot, or in its queue). Half or more of the median TTFT spent waiting: requests wait for a seat.")

    def value(self, facts: Facts) -> float | None:
        c = facts.client
        if c is None or not c.wait_before_prompt_s or not c.ttft_s or not c.ttft_s["p50"]:
            return None
        return c.wait_before_prompt_s["p50"] / c.ttft_s["p50"]

    def describe(self, facts: Facts, value: float | None) -> str:
        c = facts.client
        if value is None or c is None or not c.wait_before_prompt_s or not c.ttft_s:
            return "the server sent no timings of its own"
        return (f"median {c.wait_before_prompt_s['p50'] * 1000:.0f} ms before the server began the prompt, of a "
                f"median TTFT of {c.ttft_s['p50'] * 1000:.0f} ms ({pct(value)})")


def overload_lever(deciding: list[Evidence], facts: Facts) -> tuple[str, str] | None:
    """``(lever, summary)`` when one of these rules made the verdict, else None."""
    names = {e.name for e in deciding}
    f = facts.failures
    failed = f.describe() if f is not None else ""
    if "overload_context" in names:
        return ("give the server more context / KV cache for the requests it runs at once (llama-server: a larger "
                "-c, or fewer -np slots sharing it), or quantize the KV cache",
                f"requests ran out of context or KV cache under this load ({failed}): memory holds the server")
    if "overload_refused" in names:
        return ("give the server more seats: more parallel slots or sequences (llama-server -np, vLLM "
                "--max-num-seqs), or a longer queue instead of refusing",
                f"requests were dropped or refused under this load ({failed}): the server ran out of seats")
    if "tpot_over_single_stream" in names:
        ratio = next((e.value for e in deciding if e.name == "tpot_over_single_stream"), None)
        return ("make each step cheaper (faster kernels, quantized weights, more threads or a faster device) or add "
                "replicas: more slots cannot help",
                f"every request decodes and each is {num(ratio)}x slower than alone: the batch's work saturates "
                f"the device")
    return None
