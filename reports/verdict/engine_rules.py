"""The diagnosis rules on the engine's own step rows, each with its threshold and the reason for it.

Thresholds are set from what each lever does, with margins checked against the labelled
scenario suites (tests/reports/scenarios.py, tests/reports/agreement.py): on dummy:tiny the
healthy engine spends 15-30% of a step on the host, requests wait in 95-100% of the busy time
when a limit binds, and 0% when none does, so every threshold below sits well clear of both.

Execution is judged from measured evidence only: the host time between device work (the step
probe's phases and the gaps between steps) and the optimized path timed against the run's own, read
at the run's decode batch off the step calibration measured before the load (probes.step_calibration). How far a step is from its roofline floor (its
bytes and FLOPs at the machine's measured peaks) supports the verdict but never makes it: a small
model's steps are all dispatch, whatever the path.
"""

from __future__ import annotations

from reports.levers.saturation import ENGINE_BUSY, FAR_FROM_ROOF
from reports.measures import LIMIT_BUDGET, LIMIT_CAP, LIMIT_IDLE, LIMIT_MEMORY, ServerMeasures
from reports.verdict.evidence import Facts, Rule, num, pct

# -- load: is the server under pressure at all? --------------------------------------------------
IDLE_BUSY_FRACTION = 0.5
NO_QUEUE_SHARE = 0.1
BATCH_ROOM_FRACTION = 0.5
# -- batching ------------------------------------------------------------------------------------
QUEUE_SHARE = 0.3
MEMORY_HEADROOM = 1.5
# -- cache ---------------------------------------------------------------------------------------
PREEMPTIONS_PER_REQUEST = 0.05
KV_FULL = 0.9
KV_WASTE = 0.4
# -- execution -----------------------------------------------------------------------------------
OVERHEAD_SHARE = 0.5
PATH_SHARE = 0.3
BATCH_FILLED = 0.6


class _BusyFraction(Rule):
    """A rule on the share of the window the engine was stepping."""

    def value(self, facts: Facts) -> float | None:
        return facts.server.busy_fraction if facts.server else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"the engine was stepping {pct(value)} of the measurement window"


class _BatchFill(Rule):
    """A rule on the mean batch over what max_num_seqs and the KV pool allow."""

    def value(self, facts: Facts) -> float | None:
        s = facts.server
        return s.mean_batch / s.batch_limit if s and s.batch_limit else None

    def describe(self, facts: Facts, value: float | None) -> str:
        s = facts.server
        limit = num(s.batch_limit) if s else "n/a"
        return f"the mean batch was {num(s.mean_batch if s else None)} sequences of {limit} allowed ({pct(value)})"


def _waiting_on(s: ServerMeasures, *limits: str) -> float:
    """The share of the busy time requests waited while one of ``limits`` held the batch."""
    return s.waiting_share * sum(s.wait_limits[limit] for limit in limits)


class EngineIdle(_BusyFraction):
    name = "engine_idle"
    bottleneck = "none"
    threshold = IDLE_BUSY_FRACTION
    comparison = "<="
    why = ("An engine working under half of the wall time has at least 2x headroom: it could take twice this "
           "load before any lever inside it limits throughput.")


class QueueAbsent(Rule):
    name = "queue_absent"
    bottleneck = "none"
    threshold = NO_QUEUE_SHARE
    comparison = "<="
    why = ("Requests waiting in under a tenth of the busy time are admitted at once; a burst queues briefly even "
           "on a server with room, so a few waiting steps are not a limit.")

    def value(self, facts: Facts) -> float | None:
        return facts.server.waiting_share if facts.server else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"requests were waiting in {pct(value)} of the busy time"


class BatchHasRoom(_BatchFill):
    name = "batch_has_room"
    bottleneck = "none"
    threshold = BATCH_ROOM_FRACTION
    comparison = "<="
    why = ("A batch at most half of what max_num_seqs and the KV pool allow, with nobody waiting, means more "
           "concurrent requests would be batched, not queued: the offered load is what is missing.")


class BatchLimitQueue(Rule):
    name = "batch_limit_queue"
    bottleneck = "batching"
    threshold = QUEUE_SHARE
    why = ("Requests waited, in at least 30% of the busy time, while the batch was held by a batching limit "
           "(max_num_seqs reached, the token budget spent, or seats left empty by a scheduler that does not admit "
           "mid-batch) and not by memory: sustained, not a burst, and a limit a setting can lift.")

    def value(self, facts: Facts) -> float | None:
        s = facts.server
        if s is None:
            return None
        return _waiting_on(s, LIMIT_CAP, LIMIT_BUDGET, LIMIT_IDLE)

    def describe(self, facts: Facts, value: float | None) -> str:
        s = facts.server
        if s is None:
            return "no engine steps"
        limits = ", ".join(f"{name} {pct(s.wait_limits[name])}" for name in (LIMIT_CAP, LIMIT_BUDGET, LIMIT_IDLE))
        return f"requests waited on a batching limit in {pct(value)} of the busy time (of the waiting time: {limits})"


class MemoryHasRoom(Rule):
    name = "memory_has_room"
    bottleneck = "batching"
    threshold = MEMORY_HEADROOM
    why = ("Lifting a batching limit only helps if the KV pool can hold the extra sequences: it must hold at least "
           "1.5x the mean batch, or the next limit (memory, the cache lever) is right behind it. Unknown for "
           "servers without a block pool (naive/static), where it does not block the verdict.")

    def value(self, facts: Facts) -> float | None:
        s = facts.server
        if s is None or s.kv_capacity_seqs is None or s.mean_batch <= 0:
            return None
        return s.kv_capacity_seqs / s.mean_batch

    def describe(self, facts: Facts, value: float | None) -> str:
        s = facts.server
        if s is None or s.kv_capacity_seqs is None:
            return "the server has no KV block pool to measure"
        return f"the KV pool holds {num(s.kv_capacity_seqs)} requests of this run's size, {num(value)}x the mean batch"


class KvBlocksQueue(Rule):
    name = "kv_blocks_queue"
    bottleneck = "cache"
    threshold = QUEUE_SHARE
    why = ("Requests waited, in at least 30% of the busy time, while the free KV blocks could not hold the next "
           "one (or running requests were preempted): active request state filled memory and capped the batch.")

    def value(self, facts: Facts) -> float | None:
        s = facts.server
        return _waiting_on(s, LIMIT_MEMORY) if s and s.kv_pool_blocks else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"requests waited for KV memory in {pct(value)} of the busy time"


class Preemptions(Rule):
    name = "preemptions"
    bottleneck = "cache"
    threshold = PREEMPTIONS_PER_REQUEST
    why = ("A preemption throws away a request's whole computed context to be recomputed later; at one in twenty "
           "requests the recompute is a visible share of the work, and it only happens when the KV pool is full.")

    def value(self, facts: Facts) -> float | None:
        s = facts.server
        return s.preemptions_per_request if s and s.kv_pool_blocks else None

    def describe(self, facts: Facts, value: float | None) -> str:
        s = facts.server
        return f"{s.num_preemptions if s else 0} preemptions, {num(value)} per finished request"


class KvNearFull(Rule):
    name = "kv_near_full"
    bottleneck = "cache"
    threshold = KV_FULL
    why = ("Block usage at 90% or more in a tenth of the steps leaves too little for the next request; on its "
           "own it is only good use of memory, so it supports a cache verdict but never makes one.")

    def value(self, facts: Facts) -> float | None:
        return facts.server.kv_usage_p90 if facts.server else None

    def describe(self, facts: Facts, value: float | None) -> str:
        s = facts.server
        return f"KV blocks in use: p90 {pct(value)}, mean {pct(s.kv_usage_mean if s else None)}"


class KvWaste(Rule):
    name = "kv_waste"
    bottleneck = "cache"
    threshold = KV_WASTE
    why = ("Paged KV leaves under one block per sequence unused; when over 40% of the slots running requests hold "
           "are empty, memory is reserved for tokens that never come (a contiguous max-length layout), and paging "
           "is the lever rather than more memory.")

    def value(self, facts: Facts) -> float | None:
        return facts.server.kv_waste if facts.server else None

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"{pct(value)} of the KV slots held by running requests were empty"


class HostOverhead(Rule):
    name = "host_overhead"
    bottleneck = "execution"
    threshold = OVERHEAD_SHARE
    why = ("When host-side work (scheduling, input preparation, sampling, output handling, added overhead) and "
           "idle gaps between steps take half of the step time or more, removing them at least doubles the step "
           "rate; an optimized path keeps them near 10%, and this engine's healthy runs sit at 15-30%.")

    def value(self, facts: Facts) -> float | None:
        return facts.server.overhead_share if facts.server else None

    def describe(self, facts: Facts, value: float | None) -> str:
        s = facts.server
        if s is None:
            return "no engine steps"
        return (f"host time and gaps were {pct(value)} of each step (host phases {pct(s.host_share)}, idle gaps "
                f"{pct(s.gap_share)}, forward {pct(s.forward_share)}; mean step {s.mean_step_s * 1000:.1f} ms)")


class OptimizedPathRemoves(Rule):
    name = "optimized_path_removes"
    bottleneck = "execution"
    threshold = PATH_SHARE
    why = ("The optimized execution path (fused and prepacked GEMMs, reused buffers, CUDA graphs on a GPU) timed "
           "against the run's own path before the load (decode steps at several batch sizes, interleaved), read at "
           "the run's own decode batch: when it takes "
           "at least 30% less time per step (1.43x the step rate), the path is what holds the steps back. Measured, "
           "not assumed: on a small model the optimized path can be the slower one, and then this does not pass.")

    def value(self, facts: Facts) -> float | None:
        paths = facts.execution_paths
        if paths is None:
            return None
        return 0.0 if paths.run_path == "optimized" else paths.share_removed()

    def describe(self, facts: Facts, value: float | None) -> str:
        p = facts.execution_paths
        if p is None:
            return "the execution paths were not timed for this run (no step_calibration.json)"
        timed = ", ".join(f"{path} {seconds * 1000:.2f} ms" for path, seconds in p.step_s.items())
        shape = f"{p.batch} sequences of {p.context} tokens"
        if p.run_path == "optimized":
            return f"the run used the optimized path already (decode step on {shape}: {timed})"
        return (f"on the run's decode batch ({shape}) a step took {timed}: the optimized path would remove "
                f"{pct(value)} of the {p.run_path} step")


class EngineBusy(_BusyFraction):
    name = "engine_busy"
    bottleneck = "execution"
    threshold = ENGINE_BUSY
    why = ("An engine stepping 90% of the window or more has no idle time left to absorb more work: what it "
           "serves is what its steps can do. With nobody waiting for a seat or memory and its batch well used, "
           "the work itself holds it, and only a cheaper step (another dtype, quantized weights, another path or "
           "device) serves more.")


class NoSeatOrMemoryWait(Rule):
    name = "no_seat_or_memory_wait"
    bottleneck = "execution"
    threshold = NO_QUEUE_SHARE
    comparison = "<="
    why = ("Requests that wait for a seat (max_num_seqs) or for KV memory in under a tenth of the busy time are "
           "not held by a setting of the batch or the cache; waiting on the token budget while the engine is busy "
           "is the step's work, not a limit a bigger budget lifts.")

    def value(self, facts: Facts) -> float | None:
        s = facts.server
        if s is None:
            return None
        return _waiting_on(s, LIMIT_CAP, LIMIT_MEMORY)

    def describe(self, facts: Facts, value: float | None) -> str:
        return f"requests waited for a seat or for KV memory in {pct(value)} of the busy time"


class BatchFilled(_BatchFill):
    name = "batch_filled"
    bottleneck = "execution"
    threshold = BATCH_FILLED
    why = ("A batch at 60% or more of what max_num_seqs and the KV pool allow is well used: a busy engine at that "
           "batch is held by its steps' cost; below it more users would still be batched, not slowed (the load's "
           "limit).")


class FarFromRoof(Rule):
    name = "far_from_roof"
    bottleneck = "execution"
    threshold = FAR_FROM_ROOF
    comparison = "<="
    why = ("A decode step's floor is the time its weight + KV bytes and FLOPs need at this machine's measured peaks; "
           "under 30% of the step spent at that floor, the step waits on something other than the device's "
           "bandwidth or arithmetic. It supports an execution verdict; small models never come near the roof "
           "(their steps are all dispatch), so it never makes one.")

    def value(self, facts: Facts) -> float | None:
        r = facts.roofline
        if r is None or r.decode_floor_s is None or not r.decode_step_s or r.above_roof:
            return None
        return r.decode_floor_s / r.decode_step_s

    def describe(self, facts: Facts, value: float | None) -> str:
        r = facts.roofline
        if r is None or r.peaks is None:
            return "no roofline: the model shape or this machine's peaks are unknown"
        if r.above_roof:
            above = ", ".join(f"{k} {v:.2f}" for k, v in r.above_roof.items())
            return f"unknown: {above} exceed 1, so the peaks were measured low"
        if r.decode_floor_s is None or r.decode_step_s is None:
            return "no decode steps"
        return (f"a decode step took {r.decode_step_s * 1000:.2f} ms where its bytes and FLOPs need "
                f"{r.decode_floor_s * 1000:.3f} ms at the peaks ({pct(value)} of it; MBU {pct(r.decode_mbu)}, "
                f"MFU {pct(r.decode_mfu)})")
