"""Where a throughput curve saturates, read from every point at once: the capacity in users and the level.

A closed loop's output throughput does not fall as users are added until the server thrashes, so the
measured curve is first made non-decreasing in users (weighted least squares, pool adjacent violators,
each point weighted by its precision, the inverse square of its standard error where its interval is
known): a point that reads below a lighter one is pooled with it, and the points of the plateau are
pooled into one level, their weighted mean. That level is the **saturation throughput**; the capacity is
the fewest users whose fitted throughput reaches ``PLATEAU_SHARE`` of it. The weights keep a point
measured to ±60% from moving the level as much as one measured to ±5%.

Why not the knee of a two-segment fit (:mod:`reports.capacity.knee`, still drawn in the report): on a
curve that bends by degrees (a CPU saturating under its own work, no seat limit) the best breakpoint
jumps between neighbouring points with each point's noise, and a level read off the single best point
is the noisiest reading of the plateau there is. Re-read over the main job's recorded holds, the
pooled level moved less between runs than the best point, and the capacity less than the knee
(docs/results.md, "Repeatability of the main job"). What it cannot help: a heaviest point that reads
above every other stands alone at the top of the fit (isotonic regression's spike at its end), so a
noisy heaviest point still widens the capacity's interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# The capacity is the fewest users whose fitted throughput reaches this share of the saturation throughput.
PLATEAU_SHARE = 0.9


def monotone_fit(throughputs: Sequence[float], weights: Sequence[float] | None = None) -> np.ndarray:
    """The weighted least-squares non-decreasing fit of ``throughputs`` (in order of users): adjacent points that
    fall are replaced by their weighted mean until none does (pool adjacent violators; equal weights without
    ``weights``)."""
    w = np.ones(len(throughputs)) if weights is None else np.asarray(weights, dtype=float)
    if len(w) != len(throughputs) or np.any(w <= 0):
        raise ValueError(f"need one positive weight per throughput, got {list(w)} for {len(throughputs)} points")
    blocks: list[list[float]] = []  # [weighted mean, total weight, number of points] of each pooled run
    for value, weight in zip(throughputs, w, strict=True):
        blocks.append([float(value), float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (mean_b, w_b, num_b), (mean_a, w_a, num_a) = blocks.pop(), blocks.pop()
            blocks.append([(mean_a * w_a + mean_b * w_b) / (w_a + w_b), w_a + w_b, num_a + num_b])
    return np.concatenate([np.full(int(num), mean) for mean, _, num in blocks]) if blocks else np.zeros(0)


def saturation_throughput(throughputs: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """The level the curve saturates at: the top of its non-decreasing fit (the weighted mean of the plateau's
    points)."""
    if not len(throughputs):
        raise ValueError("no throughputs to fit")
    return float(monotone_fit(throughputs, weights)[-1])


def choose_users(users: Sequence[int], throughputs: Sequence[float], weights: Sequence[float] | None = None) -> int:
    """The capacity of one curve (``users`` ascending), in users: the fewest whose non-decreasing fit reaches
    ``PLATEAU_SHARE`` of the saturation throughput."""
    if len(users) != len(throughputs) or not len(users):
        raise ValueError(f"need one throughput per point, got {len(users)} points and {len(throughputs)} throughputs")
    if any(b <= a for a, b in zip(users, users[1:], strict=False)):
        raise ValueError(f"users must ascend, got {list(users)}")
    fit = monotone_fit(throughputs, weights)
    return int(next(u for u, y in zip(users, fit, strict=True) if y >= PLATEAU_SHARE * fit[-1]))


def plateau_start(users: Sequence[int], throughputs: Sequence[float], weights: Sequence[float] | None = None) -> int:
    """The lightest point pooled into the saturation level (where the fit's last flat run begins)."""
    fit = monotone_fit(throughputs, weights)
    first = len(fit) - 1
    while first > 0 and fit[first - 1] == fit[-1]:
        first -= 1
    return int(users[first])


def precision_weights(standard_errors: Sequence[float | None]) -> list[float] | None:
    """Each point's weight, the inverse square of its standard error; None (equal weights) when any point has no
    interval. A zero-width interval counts as a hundredth of the smallest nonzero error."""
    if not standard_errors or any(se is None for se in standard_errors):
        return None
    known = [float(se) for se in standard_errors if se]  # type: ignore[arg-type]
    floor = min(known) / 100 if known else 1.0
    return [1.0 / max(float(se), floor) ** 2 for se in standard_errors]  # type: ignore[arg-type]
