"""How sure a point's throughput is: the token rate over sub-windows, and the interval of its mean.

A point's output tokens/s is the mean of its token rate over the measured window. Cut the window
into equal sub-windows (``SUB_WINDOW_S``) and the rates of neighbouring sub-windows are not
independent: the same requests decode through both, and a long prompt's prefill slows several in a
row. So the interval is the batch-means one of simulation output analysis: consecutive sub-windows
are grouped into a few batches long enough to be nearly independent, and the batches' means give a
Student-t interval of the overall mean. It describes the throughput of this load on this request
sequence (the seed): which requests land in the window is part of the noise it measures.

With a control (the prompt tokens prefilled per sub-window), most of that noise is explained away: on
a CPU the output rate falls as prefill rises, closely (docs/results.md, the main job's repeatability), so
which long prompts landed in which batch set the batches' spread, while runs of one seed measured each
point far closer to each other than that spread. The controlled
interval is the batch-means interval of the rates less their regression on the control (the mean is
unchanged; a degree of freedom goes to the slope): how sure the rate is *given the prefill work this
window did*, which is what a rerun of the same seed repeats and what tells two points of one search apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

CONFIDENCE = 0.95
# Width of the sub-windows the token rate is counted in, seconds.
SUB_WINDOW_S = 1.0
# Fewest batches an interval is computed from: below it the t quantile (and the batches' spread) is too loose.
MIN_BATCHES = 4
# Most batches: more, shorter batches would be correlated (a request lives several seconds).
MAX_BATCHES = 8


@dataclass(frozen=True, slots=True)
class RateInterval:
    """A mean rate with its confidence interval, and what it was computed from."""

    value: float
    low: float
    high: float
    confidence: float
    num_batches: int
    batch_s: float  # the length of one batch, seconds
    controlled: bool = False  # the rates' regression on a control (the prefill rate) was taken out first

    @property
    def dof(self) -> int:
        """Degrees of freedom of its t quantile: one per batch, less one for the mean and one for a control's slope."""
        return self.num_batches - 1 - int(self.controlled)

    @property
    def half_width(self) -> float:
        # NOTE: from the top: the interval is symmetric about the value, but its low end is cut at zero
        return self.high - self.value

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width over its value (``inf`` for a zero value): 0.05 is "within ±5%"."""
        return self.half_width / self.value if self.value > 0 else math.inf

    def to_dict(self) -> dict[str, float | int]:
        return {"value": self.value, "low": self.low, "high": self.high, "confidence": self.confidence,
                "num_batches": self.num_batches, "batch_s": self.batch_s, "controlled": self.controlled}

    @classmethod
    def from_dict(cls, data: dict[str, float | int]) -> RateInterval:
        return cls(float(data["value"]), float(data["low"]), float(data["high"]), float(data["confidence"]),
                   int(data["num_batches"]), float(data["batch_s"]), bool(data.get("controlled", False)))


def token_rate_series(times: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray, start: float,
                      end: float, width: float = SUB_WINDOW_S) -> np.ndarray:
    """Tokens per second in each whole sub-window of ``width`` from ``start`` (a partial last one is dropped).

    ``times`` are when tokens arrived and ``weights`` how many tokens each arrival carried (a chunk
    may carry several, or a fraction when a request's tokens are spread over its chunks).
    """
    if width <= 0:
        raise ValueError(f"sub-window width must be > 0, got {width}")
    num = int(math.floor((end - start) / width + 1e-9))
    if num < 1:
        return np.zeros(0)
    edges = start + width * np.arange(num + 1)
    counts, _ = np.histogram(np.asarray(times, dtype=float), bins=edges, weights=np.asarray(weights, dtype=float))
    return counts / width


def student_t_quantile(probability: float, dof: int) -> float:
    """The ``probability`` quantile of Student's t with ``dof`` degrees of freedom.

    The Cornish-Fisher expansion around the normal quantile (Abramowitz and Stegun 26.7.5): within
    0.2% of the exact value from 3 degrees of freedom on (2.776 for 4 at 0.975), which is all a
    batch-means interval needs; numpy alone, no scipy.
    """
    if dof < 1:
        raise ValueError(f"need at least one degree of freedom, got {dof}")
    z = NormalDist().inv_cdf(probability)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / dof + g2 / dof ** 2 + g3 / dof ** 3 + g4 / dof ** 4


def num_batches_for(num_samples: int) -> int:
    """How many batches ``num_samples`` sub-windows are grouped into: about their square root, so
    batches grow with the window (their correlation fades) while their number grows too."""
    return int(min(MAX_BATCHES, max(MIN_BATCHES, math.isqrt(num_samples))))


def batch_means_interval(rates: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE,
                         width: float = SUB_WINDOW_S,
                         control: Sequence[float] | np.ndarray | None = None) -> RateInterval | None:
    """The mean of ``rates`` (one per sub-window of ``width`` s) with its batch-means interval; None
    with fewer sub-windows than ``MIN_BATCHES`` (nothing to tell the spread from).

    The sub-windows are cut into equal consecutive batches (the first few dropped when they do not
    divide evenly, so the batches end with the window); the interval is the batches' mean plus or
    minus the t quantile times their standard error. ``control``: one value per sub-window (the
    prefill rate) whose least-squares slope over the sub-windows is taken out of the rates before
    batching; ignored when it does not vary.
    """
    x = np.asarray(rates, dtype=float)
    if len(x) < MIN_BATCHES:
        return None
    num_batches = num_batches_for(len(x))
    size = len(x) // num_batches
    mean = float(x.mean())  # NOTE: every sub-window's; the batches only tell the spread
    spread, controlled = x, False
    if control is not None and num_batches > 2:
        z = np.asarray(control, dtype=float)
        if z.shape != x.shape:
            raise ValueError(f"need one control value per rate, got {z.shape} for {x.shape}")
        dz = z - z.mean()
        if float(dz @ dz) > 0:
            spread, controlled = x - float(dz @ (x - mean)) / float(dz @ dz) * dz, True
    batches = spread[len(x) - size * num_batches:].reshape(num_batches, size).mean(axis=1)
    se = float(batches.std(ddof=1 + int(controlled))) / math.sqrt(num_batches)
    half = student_t_quantile(0.5 + confidence / 2, num_batches - 1 - int(controlled)) * se
    # NOTE: a rate is never negative: where the batches spread wider than the mean (a window that never steadied),
    # the low end stops at zero instead of reading as a negative token rate
    return RateInterval(mean, max(0.0, mean - half), mean + half, confidence, num_batches, size * width, controlled)
