"""Arrival processes: when the open loop sends its requests.

The closed loop needs none (each user sends when its previous request ends). The open loop draws
seeded gaps between arrivals: exponential for a Poisson process, gamma with shape ``burstiness``
for a burstier (< 1) or smoother (> 1) one at the same mean rate, as vLLM's benchmark does. Each
arrival may carry ``burst_size`` requests at once.

NOTE: with several worker processes each runs its own process at ``rate / num_workers``; the sum
of independent Poisson processes is a Poisson process at the total rate.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class OpenLoopArrivals:
    """Arrivals at ``rate`` requests/s on average, ``burst_size`` requests per arrival."""

    rate: float
    burstiness: float = 1.0
    burst_size: int = 1

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.burst_size < 1:
            raise ValueError(f"burst_size must be >= 1, got {self.burst_size}")

    @property
    def mean_gap_s(self) -> float:
        """Mean time between arrivals (each of ``burst_size`` requests)."""
        return self.burst_size / self.rate

    def gaps(self, rng: random.Random) -> Iterator[float]:
        """Seconds from one arrival to the next, forever; the same ``rng`` state gives the same gaps."""
        mean = self.mean_gap_s
        if self.burstiness == 1.0:
            while True:
                yield rng.expovariate(1.0 / mean)
        shape = self.burstiness
        while True:
            yield rng.gammavariate(shape, mean / shape)

    def for_worker(self, num_workers: int) -> OpenLoopArrivals:
        """The share one of ``num_workers`` independent workers must send."""
        return OpenLoopArrivals(self.rate / num_workers, self.burstiness, self.burst_size)


def worker_rng(seed: int, worker_index: int) -> random.Random:
    """The arrival RNG of one worker: reproducible, and independent across workers."""
    # NOTE: str seeds hash with SHA-512 (random.seed version 2), independent of PYTHONHASHSEED.
    return random.Random(f"servescope-arrivals-{seed}-{worker_index}")
