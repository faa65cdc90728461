"""Where a throughput curve stops rising (the knee), and how sure a measured share is (Wilson interval).

The knee is found by a continuous two-segment (hinge) least-squares fit of throughput against
concurrency, ``y = c + s1 * min(x - b, 0) + s2 * max(x - b, 0)``, with the breakpoint ``b``
chosen among the measured concurrencies. A curve has a knee only when the hinge explains the
points clearly better than one straight line and the segment after the breakpoint is much
flatter than the one before it; otherwise the fit says why there is none.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# After the knee, throughput grows at most this fraction of its slope before it.
MAX_SLOPE_RATIO_AFTER_KNEE = 0.35
# The hinge must leave at most this share of a straight line's squared error (or both are near exact).
MAX_RESIDUAL_SHARE = 0.5
# Fewer measured points than this cannot show a bend (two per segment, sharing the breakpoint).
MIN_POINTS = 3
Z_95 = 1.959963984540054  # the two-sided 95% normal quantile


@dataclass(slots=True)
class KneeFit:
    """The two-segment fit of one curve: its breakpoint, both slopes, and whether that is a knee."""

    breakpoint: float | None  # the concurrency where the segments meet (a measured point)
    intercept: float | None  # the fitted throughput at the breakpoint
    slope_before: float | None
    slope_after: float | None
    sse: float | None  # squared error of the two-segment fit
    sse_line: float | None  # squared error of one straight line through all points
    has_knee: bool
    reason: str  # why this is (or is not) a knee, in words

    def predict(self, x: float) -> float | None:
        if self.breakpoint is None or self.intercept is None or self.slope_before is None \
                or self.slope_after is None:
            return None
        d = x - self.breakpoint
        return self.intercept + self.slope_before * min(d, 0.0) + self.slope_after * max(d, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KneeFit:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


def fit_knee(xs: list[float], ys: list[float]) -> KneeFit:
    """The best hinge over ``(xs, ys)`` with its breakpoint at one of the interior ``xs``."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} concurrencies against {len(ys)} throughputs")
    order = np.argsort(xs)
    x, y = np.asarray(xs, dtype=float)[order], np.asarray(ys, dtype=float)[order]
    if len(x) < MIN_POINTS or len(np.unique(x)) < MIN_POINTS:
        return KneeFit(None, None, None, None, None, None, False,
                       f"{len(np.unique(x))} distinct load points; a knee needs at least {MIN_POINTS}")
    line = np.polyfit(x, y, 1)
    sse_line = float(np.sum((np.polyval(line, x) - y) ** 2))
    best: tuple[float, float, np.ndarray] | None = None
    for b in np.unique(x)[1:-1]:
        basis = np.column_stack([np.ones_like(x), np.minimum(x - b, 0.0), np.maximum(x - b, 0.0)])
        coef = np.linalg.lstsq(basis, y, rcond=None)[0]
        sse = float(np.sum((basis @ coef - y) ** 2))
        if best is None or sse < best[1]:
            best = (float(b), sse, coef)
    assert best is not None
    b, sse, (c, s1, s2) = best
    fit = KneeFit(b, float(c), float(s1), float(s2), sse, sse_line, False, "")
    scale = float(np.sum((y - y.mean()) ** 2)) or 1.0
    if s1 <= 0:
        fit.reason = f"throughput does not rise before {b:g} (slope {s1:.3g}): no knee, flat from the start"
    elif s2 > MAX_SLOPE_RATIO_AFTER_KNEE * s1:
        fit.reason = (f"throughput still rises after {b:g} at {s2 / s1:.0%} of its slope before "
                      f"(a knee needs at most {MAX_SLOPE_RATIO_AFTER_KNEE:.0%}): no knee in the measured range")
    elif sse > MAX_RESIDUAL_SHARE * sse_line and sse_line > 1e-6 * scale:
        fit.reason = (f"two segments leave {sse / sse_line:.0%} of one line's squared error (a knee needs at most "
                      f"{MAX_RESIDUAL_SHARE:.0%}): no clear bend")
    else:
        fit.has_knee = True
        fit.reason = (f"throughput rises {s1:.3g} per unit of concurrency up to {b:g}, then {s2:.3g} "
                      f"({s2 / s1:.0%} of the slope before)")
    return fit


@dataclass(slots=True, frozen=True)
class Interval:
    """A share with its confidence interval."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> Interval:
    """The Wilson score interval of ``successes / trials`` (95% by default).

    Unlike the normal approximation it stays inside [0, 1] and is not zero-width at 0 or 1.
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    p = successes / trials
    z2 = z * z
    center = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z / (1 + z2 / trials) * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    return Interval(p, max(0.0, center - half), min(1.0, center + half))
