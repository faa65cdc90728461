"""How much slower is B than A, from paired per-round ratios: an estimate, its interval and a p-value.

An A/B run measures both sides once per round on the same work, so each round gives one ratio
``candidate / base``. The decision works on their logarithms with the Wilcoxon signed-rank family,
which assumes only that the log-ratios scatter symmetrically around their centre (a shared machine's
noise spikes do not drag it, as they drag a mean):

- the estimate is the Hodges-Lehmann shift, the median of the Walsh averages ``(x_i + x_j) / 2``;
- the interval is the signed-rank test inverted: order statistics of those Walsh averages, cut at the
  exact null distribution's critical value;
- the p-value is the one-sided signed-rank test of "slower by at most the threshold".

Because the interval and the p-value come from the same test, ``low > threshold`` holds exactly when
``p_value <= (1 - confidence) / 2``: the printed interval and the printed p never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class Slowdown:
    """``candidate / base - 1`` with its interval; positive means the candidate is slower."""

    estimate: float
    low: float
    high: float
    confidence: float
    threshold: float
    p_value: float  # one-sided: probability of data this slow if the slowdown were at most ``threshold``
    p_change: float  # two-sided: against no change at all
    num_samples: int

    @property
    def is_regression(self) -> bool:
        """The interval lies wholly above the threshold: slower by more than it, at this confidence."""
        return self.low > self.threshold

    @property
    def is_measured_slower(self) -> bool:
        """The interval lies wholly above zero: the candidate is slower, by however little."""
        return self.low > 0

    def to_dict(self) -> dict[str, float | int]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "confidence": self.confidence,
                "threshold": self.threshold, "p_value": self.p_value, "p_change": self.p_change,
                "num_samples": self.num_samples}


@cache
def signed_rank_null(n: int) -> np.ndarray:
    """``P(T+ = t)`` for ``t = 0 .. n(n+1)/2`` when no sign is preferred: the exact null distribution.

    ``T+`` is the sum of the ranks of the positive values; under the null each rank 1..n is in the
    sum with probability 1/2, independently, so the distribution is the subset-sum count over 2^n.
    """
    if n < 1:
        raise ValueError(f"need at least one sample, got {n}")
    probs = np.zeros(n * (n + 1) // 2 + 1)
    probs[0] = 1.0
    for rank in range(1, n + 1):
        # NOTE: each rank joins the sum or not, with probability 1/2 each
        shifted = np.zeros_like(probs)
        shifted[rank:] = probs[:-rank]
        probs = (probs + shifted) / 2
    return probs


def _upper_tail(n: int, t: int) -> float:
    """``P(T+ >= t)`` under the null."""
    probs = signed_rank_null(n)
    return float(probs[max(t, 0):].sum()) if t < len(probs) else 0.0


def _walsh_averages(x: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(len(x))
    return np.sort((x[i] + x[j]) / 2)


def min_samples(confidence: float) -> int:
    """The fewest rounds whose most extreme outcome is rarer than ``1 - confidence`` (6 at 95%)."""
    n = 1
    while 2 * 0.5**n > 1 - confidence:
        n += 1
    return n


def estimate_slowdown(ratios: Sequence[float], threshold: float,
                      confidence: float = DEFAULT_CONFIDENCE) -> Slowdown:
    """The slowdown that paired ``candidate / base`` ratios (one per round) show, tested against ``threshold``."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    if threshold <= -1:
        raise ValueError(f"threshold must be above -100%, got {threshold!r}")
    values = np.asarray(ratios, dtype=float)
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError("every ratio must be a positive finite number")
    n = len(values)
    if n < min_samples(confidence):
        raise ValueError(f"{n} rounds cannot give a {confidence:.0%} interval; give at least "
                         f"{min_samples(confidence)}")
    logs = np.log(values)
    walsh = _walsh_averages(logs)
    num_walsh = len(walsh)
    # The interval: the smallest t with P(T+ >= t) <= alpha/2 is the upper critical value; the bounds
    # are the Walsh averages at positions num_walsh - t (low) and t - 1 (high), 0-based.
    alpha = 1 - confidence
    tail = np.cumsum(signed_rank_null(n)[::-1])[::-1]  # tail[t] = P(T+ >= t)
    critical = int(np.argmax(tail <= alpha / 2))
    low, high = walsh[num_walsh - critical], walsh[critical - 1]
    # NOTE: T+ of the data shifted by d equals the number of Walsh averages above d.
    t_threshold = int(np.sum(walsh > math.log1p(threshold)))
    t_zero = int(np.sum(walsh > 0))
    p_change = min(1.0, 2 * min(_upper_tail(n, t_zero), 1 - _upper_tail(n, t_zero + 1)))
    return Slowdown(
        estimate=math.expm1(float(np.median(walsh))), low=math.expm1(float(low)), high=math.expm1(float(high)),
        confidence=confidence, threshold=threshold, p_value=_upper_tail(n, t_threshold), p_change=p_change,
        num_samples=n,
    )


def format_slowdown(s: Slowdown) -> str:
    """One line: ``+9.8% (95% interval +8.1% .. +11.5%, 20 rounds), p = 0.0001 that it is within 5%``."""
    return (f"{s.estimate:+.1%} ({s.confidence:.0%} interval {s.low:+.1%} .. {s.high:+.1%}, {s.num_samples} rounds); "
            f"p = {s.p_value:.2g} that it is at most {s.threshold:.0%}, p = {s.p_change:.2g} that nothing changed")
