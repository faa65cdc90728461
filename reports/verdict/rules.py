"""Every rule the verdict evaluates, in one list: the order their evidence is listed in ``diagnosis.json``.

A rule is a class in the file of the evidence it reads (the engine's steps, a server seen from
outside, a capacity search); it counts only once it is listed here. Findings and levers name rules
by their ``name``; :func:`rule` turns a name into its rule and fails loudly on a name nobody listed.
"""

from __future__ import annotations

from reports.verdict import capacity_rules, engine_rules, external_rules, overload_rules
from reports.verdict.evidence import Rule

RULES: tuple[Rule, ...] = (
    # a capacity search's experiments
    capacity_rules.CapacitySerial(),
    capacity_rules.CapacityOneStream(),
    capacity_rules.CapacityMemory(),
    capacity_rules.CapacitySeats(),
    capacity_rules.CapacityCompute(),
    # the engine's own steps: load, batching, cache, execution
    engine_rules.EngineIdle(),
    engine_rules.QueueAbsent(),
    engine_rules.BatchHasRoom(),
    engine_rules.BatchLimitQueue(),
    engine_rules.MemoryHasRoom(),
    engine_rules.KvBlocksQueue(),
    engine_rules.Preemptions(),
    engine_rules.KvNearFull(),
    engine_rules.KvWaste(),
    engine_rules.HostOverhead(),
    engine_rules.OptimizedPathRemoves(),
    engine_rules.EngineBusy(),
    engine_rules.NoSeatOrMemoryWait(),
    engine_rules.BatchFilled(),
    engine_rules.FarFromRoof(),
    # a server seen from outside: its /metrics, the client's timings, a sweep
    external_rules.ServerQueue(),
    external_rules.ServerQueueDepth(),
    external_rules.ServerQueueAbsent(),
    external_rules.ServerKvFull(),
    external_rules.ServerKvRoom(),
    external_rules.ServerPreemptions(),
    external_rules.FewStreamsDecoding(),
    external_rules.SweepThroughputFlat(),
    external_rules.SweepTtftGrows(),
    external_rules.SweepTpotHolds(),
    external_rules.SlowerThanOptimized(),
    # a server pressed by the load, from outside: how its requests failed, its streams against one alone
    overload_rules.OverloadRefused(),
    overload_rules.OverloadContext(),
    overload_rules.TpotOverSingleStream(),
    overload_rules.StreamsAllDecoding(),
    overload_rules.ServerSlotsBusy(),
    overload_rules.ServerWaitBeforePrompt(),
)
_BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}
if len(_BY_NAME) != len(RULES):
    raise ValueError(f"two rules share a name: {sorted(r.name for r in RULES)}")


def rule(name: str) -> Rule:
    """The listed rule called ``name``; a ValueError naming every listed rule when there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"no rule named {name!r}; the rules: {', '.join(_BY_NAME)}") from None
