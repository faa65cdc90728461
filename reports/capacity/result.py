"""A capacity search's result: the concurrency a server sustains, its throughput there, and what limits it.

:func:`capacity_result` reads the search's points back (reports.capacity.records) and decides the
capacity: with an SLO, the highest concurrency whose SLO attainment holds (Wilson interval shown);
else the fewest users within ``PLATEAU_SHARE`` of the saturation throughput, the level the curve's
non-decreasing fit tops out at (reports.capacity.saturation; the knee fit of reports.capacity.knee
is kept beside it to describe the curve's bend). What limits it is found by experiment from the
outside (reports.capacity.limit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from probes.peaks import MachinePeaks
from probes.run_dir import RunDirectory
from reports.capacity.bootstrap import (
    capacity_interval,
    saturation_interval,
    weighted_choice,
    weights_of,
)
from reports.capacity.knee import fit_knee
from reports.capacity.limit import capacity_limit, serial_gain, tokens_experiment
from reports.capacity.point import capacity_point
from reports.capacity.records import Capacity, CapacityPoint, CapacitySearch
from reports.capacity.saturation import PLATEAU_SHARE, choose_users, plateau_start, saturation_throughput
from reports.dataset import RunDataset
from reports.summary import PointMeasures


def capacity_result(root: Path, search: CapacitySearch, points: list[RunDataset],
                    measures: list[PointMeasures]) -> Capacity:
    """The capacity of the searched server; ``points`` and ``measures`` in order of users."""
    cps = [capacity_point(d, m) for d, m in zip(points, measures, strict=True)]
    rated = [p for p in cps if p.output_tokens_per_s is not None]
    knee = fit_knee([p.users for p in rated], [p.output_tokens_per_s for p in rated])  # type: ignore[misc]
    slo = dict(points[0].load_config.get("slo") or {}) if points else {}
    intervals = [p.interval for p in rated]
    complete = all(i is not None for i in intervals)  # NOTE: every point's interval: the bootstraps need them all
    weights = weights_of(intervals)
    chosen, method, reason = _choose(cps, rated, weights, slo, search.slo_attainment)
    interval, estimate = None, chosen
    if chosen is not None and method != "slo" and complete:
        interval = capacity_interval([p.users for p in rated], intervals, chosen.users,  # type: ignore[arg-type]
                                     weighted_choice(intervals))  # type: ignore[arg-type]
        if not interval.is_told_apart:
            method, reason = "undetermined", (
                f"the points cannot be told apart: redrawn within their intervals, the capacity falls anywhere "
                f"in {interval.low}-{interval.high} users ({interval.confidence:.0%}), so none is named "
                f"(the measured curve alone gives {chosen.users}: {reason})")
            chosen = None
    result = Capacity(concurrency=chosen.users if chosen else None,
                      output_tokens_per_s=chosen.output_tokens_per_s if chosen else None,
                      goodput=chosen.goodput if chosen else None, method=method, reason=reason, limit=None,
                      limit_evidence="", knee=knee, points=cps, stopped=search.stopped,
                      slo={"bounds_s": slo, "attainment": search.slo_attainment} if slo else {},
                      probed=search.probed, failed_at_users=(search.failed_at or {}).get("users"),
                      interval=interval.to_dict() if interval is not None else None,
                      output_tokens_per_s_interval=chosen.output_tokens_per_s_interval if chosen else None)
    if rated and method != "slo":
        result.saturation_tokens_per_s = saturation_throughput([p.output_tokens_per_s for p in rated],  # type: ignore[misc]
                                                               weights)
        if complete:
            result.saturation_tokens_per_s_interval = saturation_interval(intervals)  # type: ignore[arg-type]
    by_users = {p.users: p for p in rated}
    result.serial_gain = serial_gain({u: p.output_tokens_per_s for u, p in by_users.items()})
    streams = [p.decoding_streams for p in cps if p.decoding_streams is not None]
    result.max_decoding_streams = max(streams) if streams else None
    if chosen is None and estimate is not None:
        # NOTE: no capacity named, yet the curve's own estimate is still the best guess of where the limit binds:
        # the verdict is read past it (not at the heaviest point, where requests queue behind the seats whatever
        # holds the server); no capacity rule reads that point, as no capacity was named.
        result.past_knee_users = next((p.users for p in cps if p.users > estimate.users), None)
    if chosen is not None:
        past = next((p for p in cps if p.users > chosen.users), None)
        if past is not None:
            result.past_knee_users = past.users
            if past.decoding_streams is not None and past.in_flight:
                result.queue_share_past_knee = past.decoding_streams / past.in_flight
    result.tokens = tokens_experiment(root, search, by_users)
    result.limit, result.limit_evidence = capacity_limit(result)
    result.single_stream = single_stream(by_users.get(1), points, search, RunDirectory(root).read_peaks())
    return result


def _choose(cps: list[CapacityPoint], rated: list[CapacityPoint], weights: list[float] | None, slo: dict[str, float],
            target: float) -> tuple[CapacityPoint | None, str, str]:
    if slo:
        holding = [p for p in cps if p.slo_attainment is not None and p.slo_attainment["value"] >= target]
        if not holding:
            return None, "slo", f"no measured point met the SLO for {target:.0%} of its requests"
        best = max(holding, key=lambda p: p.users)
        a = best.slo_attainment
        assert a is not None
        return best, "slo", (f"the most users whose SLO attainment holds: {a['value']:.0%} of requests within the SLO "
                             f"(95% Wilson interval {a['low']:.0%}-{a['high']:.0%}; target {target:.0%})")
    if not rated:
        return None, "plateau", "no point measured any output"
    users, tputs = [p.users for p in rated], [p.output_tokens_per_s for p in rated]
    point = next(p for p in rated if p.users == choose_users(users, tputs, weights))  # type: ignore[arg-type]
    level, start = saturation_throughput(tputs, weights), plateau_start(users, tputs, weights)  # type: ignore[arg-type]
    mean = "mean" if weights is None else "mean, weighted by their precision,"
    pooled = f"the {mean} of the points from {start} users on" if start != users[-1] else f"the point at {start} users"
    return point, "plateau", (f"the fewest users within {PLATEAU_SHARE:.0%} of the throughput the curve saturates at, "
                              f"{level:.4g} tok/s ({pooled}, the curve made non-decreasing in users)")


def single_stream(point: CapacityPoint | None, points: list[RunDataset], search: CapacitySearch,
                  peaks: MachinePeaks | None) -> dict[str, Any] | None:
    """The memory-bandwidth utilisation one stream reaches: weight bytes per TPOT at 1 user over the copy bandwidth.

    Only for a target on this machine (its bandwidth is the one measured) with known weight bytes.
    """
    one = next((d for d in points if d.concurrency == 1), None)
    if one is None or point is None:
        return None
    peaks = peaks or one.peaks
    weight_bytes = search.model_bytes or (one.model_shape.weight_bytes if one.model_shape is not None else None)
    tpot = one.latencies.loc[one.latencies["is_ok"].astype(bool), "tpot_s"].dropna()
    out: dict[str, Any] = {"tpot_s": float(tpot.median()) if len(tpot) else None, "weight_bytes": weight_bytes,
                           "bandwidth_bytes_per_s": peaks.bandwidth_bytes_per_s if peaks else None, "mbu": None}
    if not search.is_local:
        out["why_not"] = "the target is not on this machine, so its memory bandwidth was not measured"
    elif weight_bytes is None:
        out["why_not"] = "the model's weight bytes are unknown (pass --model-bytes)"
    elif peaks is None or out["tpot_s"] is None:
        out["why_not"] = "no bandwidth measured or no TPOT at 1 user"
    else:
        mbu = weight_bytes / out["tpot_s"] / peaks.bandwidth_bytes_per_s
        if mbu <= 1.0:
            out["mbu"] = mbu
        else:
            out["why_not"] = (f"the weights over TPOT give {mbu:.2f} of the bandwidth, above 1: the TPOT seen by the "
                              f"client is not the time per token (tokens arrive in bursts) or the model is not "
                              f"{weight_bytes} bytes")
    return out


def capacity_focus(capacity: Capacity, measures: list[PointMeasures]) -> int:
    """Index of the point the verdict is read at (see :func:`focus_users`): past the capacity, where its limit
    binds (at the capacity itself it only starts to)."""
    users = [int(m.concurrency or 0) for m in measures]
    return users.index(focus_users(capacity, users))


def focus_users(capacity: Capacity, users: list[int]) -> int:
    """Of the measured ``users`` (in order of users), the point the verdict is read at: where requests began to
    fail from overload (their failures say which limit), else the first one past the capacity, else the
    capacity point, else the heaviest."""
    for wanted in (capacity.failed_at_users, capacity.past_knee_users, capacity.concurrency):
        if wanted is not None and wanted in users:
            return wanted
    return users[-1]
