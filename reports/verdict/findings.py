"""The findings: each way to reach a verdict, as the rules it needs, in the order the verdict tries them.

First, is there pressure at all: an engine idle over half the time with nobody waiting is limited by
its load (``none``). Then: not enough simultaneous work reaches the device (``batching``); active
request state fills memory (``cache``); work is organized but coordination is costly (``execution``).
Every rule a finding names is listed in reports.verdict.rules, checked at import.
"""

from __future__ import annotations

from dataclasses import dataclass

from reports.verdict.evidence import Bottleneck, Evidence
from reports.verdict.rules import rule


@dataclass(frozen=True, slots=True)
class Finding:
    """One way to reach a verdict: every rule of ``all_of`` passes and, if given, one of ``any_of``.

    Rules in ``unknown_ok`` may be unmeasurable (None) without blocking the finding; ``support``
    rules never decide, but raise the confidence when they pass.
    """

    bottleneck: Bottleneck
    all_of: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()
    unknown_ok: tuple[str, ...] = ()
    support: tuple[str, ...] = ()

    def fires(self, evidence: dict[str, Evidence]) -> bool:
        for name in self.all_of:
            passed = evidence[name].passed
            if not (passed or (passed is None and name in self.unknown_ok)):
                return False
        return not self.any_of or any(evidence[name].passed for name in self.any_of)

    def deciding(self, evidence: dict[str, Evidence]) -> list[Evidence]:
        names = [*self.all_of, *(n for n in self.any_of if evidence[n].passed)]
        return [evidence[n] for n in names if evidence[n].passed]


ENGINE_FINDINGS = (
    Finding("none", all_of=("engine_idle", "queue_absent"), support=("batch_has_room",)),
    Finding("batching", all_of=("batch_limit_queue", "memory_has_room"), unknown_ok=("memory_has_room",)),
    Finding("cache", any_of=("kv_blocks_queue", "preemptions"), support=("kv_near_full", "kv_waste")),
    Finding("execution", any_of=("host_overhead", "optimized_path_removes"), support=("far_from_roof",)),
    # NOTE: the engine saturated by its own work: busy, its batch well used, nobody held for a seat or memory
    Finding("execution", all_of=("engine_busy", "no_seat_or_memory_wait", "batch_filled")),
)
ENGINE_FALLBACK = Finding("none", support=("queue_absent", "batch_has_room"))
# NOTE: failures read as overload (reports.health) are direct evidence: they come before the queue's.
OVERLOAD_FINDINGS = (Finding("cache", all_of=("overload_context",)),
                     Finding("batching", all_of=("overload_refused",), support=("server_queue", "server_slots_busy",
                                                                                 "server_wait_before_prompt")))
METRICS_FINDINGS = (
    Finding("cache", all_of=("server_queue", "server_queue_depth", "server_kv_full"), support=("server_preemptions",)),
    Finding("cache", any_of=("server_preemptions",)),
    *OVERLOAD_FINDINGS,
    # NOTE: a server that exports no KV gauge (llama.cpp's current builds) still shows its queue; the
    # preemption and KV findings above are the ones that would name memory.
    Finding("batching", all_of=("server_queue", "server_queue_depth", "server_kv_room"), unknown_ok=("server_kv_room",),
            support=("few_streams_decoding", "server_slots_busy", "server_wait_before_prompt")),
    Finding("execution", all_of=("slower_than_optimized",)),
    Finding("execution", all_of=("tpot_over_single_stream", "server_queue_absent"), support=("streams_all_decoding",)),
)
SWEEP_FINDINGS = (Finding("batching", all_of=("sweep_throughput_flat", "sweep_ttft_grows", "sweep_tpot_holds"),
                          support=("few_streams_decoding",)),)
CLIENT_FINDINGS = (Finding("batching", all_of=("few_streams_decoding",)),
                   Finding("execution", all_of=("slower_than_optimized",)),
                   Finding("execution", all_of=("tpot_over_single_stream", "streams_all_decoding")))
EXTERNAL_FALLBACK = Finding("none", support=("server_queue_absent",))
# A capacity search's experiments: after the direct evidence of a server's own probes or gauges.
CAPACITY_FINDINGS = (Finding("batching", all_of=("capacity_serial", "capacity_one_stream"),
                             unknown_ok=("capacity_one_stream",)), Finding("cache", all_of=("capacity_memory",)),
                     Finding("batching", all_of=("capacity_seats",)), Finding("execution", all_of=("capacity_compute",)))


def check_rule_names(*findings: Finding) -> None:
    """Every rule the findings name is listed (reports.verdict.rules); else a ValueError naming every rule."""
    for finding in findings:
        for name in (*finding.all_of, *finding.any_of, *finding.unknown_ok, *finding.support):
            rule(name)


# NOTE: a finding that names a rule nobody listed (a typo) fails here, at import.
check_rule_names(*ENGINE_FINDINGS, ENGINE_FALLBACK, *METRICS_FINDINGS, *SWEEP_FINDINGS, *CLIENT_FINDINGS,
                 EXTERNAL_FALLBACK, *CAPACITY_FINDINGS)
