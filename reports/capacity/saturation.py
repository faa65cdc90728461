"""Where a throughput curve saturates, read from every point at once: the capacity in users and the level.

A closed loop's output throughput does not fall as users are added until the server thrashes, so the
measured curve is first made non-decreasing in users (least squares, pool adjacent violators): a point
that reads below a lighter one is pooled with it, and the points of the plateau are pooled into one
level, their mean. That level is the **saturation throughput**; the capacity is the fewest users whose
fitted throughput reaches ``PLATEAU_SHARE`` of it.

Why not the knee of a two-segment fit (:mod:`reports.capacity.knee`, still drawn in the report): on a
curve that bends by degrees (a CPU saturating under its own work, no seat limit) the best breakpoint
jumps between neighbouring points with each point's noise, and a level read off the single best point
is the noisiest reading of the plateau there is. Re-read over the main job's recorded holds, the
pooled level moved less between runs than the best point, and the capacity less than the knee
(docs/results.md, "Repeatability of the main job").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# The capacity is the fewest users whose fitted throughput reaches this share of the saturation throughput.
PLATEAU_SHARE = 0.9


def monotone_fit(throughputs: Sequence[float]) -> np.ndarray:
    """The least-squares non-decreasing fit of ``throughputs`` (in order of users): adjacent points that fall
    are replaced by their mean until none does (pool adjacent violators, every point weighted alike)."""
    blocks: list[list[float]] = []  # [mean, count] of each pooled run of points
    for value in throughputs:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (mean_b, num_b), (mean_a, num_a) = blocks.pop(), blocks.pop()
            blocks.append([(mean_a * num_a + mean_b * num_b) / (num_a + num_b), num_a + num_b])
    return np.concatenate([np.full(int(num), mean) for mean, num in blocks]) if blocks else np.zeros(0)


def saturation_throughput(throughputs: Sequence[float]) -> float:
    """The level the curve saturates at: the top of its non-decreasing fit (the mean of the plateau's points)."""
    if not len(throughputs):
        raise ValueError("no throughputs to fit")
    return float(monotone_fit(throughputs)[-1])


def choose_users(users: Sequence[int], throughputs: Sequence[float]) -> int:
    """The capacity of one curve (``users`` ascending), in users: the fewest whose non-decreasing fit reaches
    ``PLATEAU_SHARE`` of the saturation throughput."""
    if len(users) != len(throughputs) or not len(users):
        raise ValueError(f"need one throughput per point, got {len(users)} points and {len(throughputs)} throughputs")
    if any(b <= a for a, b in zip(users, users[1:], strict=False)):
        raise ValueError(f"users must ascend, got {list(users)}")
    fit = monotone_fit(throughputs)
    return int(next(u for u, y in zip(users, fit, strict=True) if y >= PLATEAU_SHARE * fit[-1]))


def plateau_start(users: Sequence[int], throughputs: Sequence[float]) -> int:
    """The lightest point pooled into the saturation level (where the fit's last flat run begins)."""
    fit = monotone_fit(throughputs)
    first = len(fit) - 1
    while first > 0 and fit[first - 1] == fit[-1]:
        first -= 1
    return int(users[first])
