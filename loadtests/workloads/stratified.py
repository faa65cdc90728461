"""Request lengths in a stratified, balanced deck: every stretch of the sequence carries the workload's mix.

Drawn one by one, a chat-like workload's prompts are heavy-tailed (sharegpt-synth: log-normal, a
prompt costs its length in prefill time), so how fast a server looks over a window depends on which
prompts land in it: at 16 users on 2 cores prefill took 57% of the engine's time, and 12 s windows of
one run read anywhere from 57 to 104 output tok/s. A deck fixes the mix instead:

- ``DECK_SIZE`` prompt lengths, one per equal-count stratum of the workload's own distribution
  (the mean of ``SAMPLE_PER_STRATUM`` seeded draws in it), and as many output lengths, stratified
  the same way; paired at random (the workloads draw the two independently, and so does the deck);
- ordered so that any run of consecutive cards spreads over the strata (the golden-ratio sequence
  over the prompt ranks): a window that sees a third of a deck sees a third of its mix;
- dealt again and again; only the lengths repeat, each request gets its own text.

A point that ends when its throughput is known (``loadtests.point_stop``) sends such a sequence.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

DECK_SIZE = 16
SAMPLE_PER_STRATUM = 256
_GOLDEN = (math.sqrt(5) - 1) / 2


def stratified_deck(draw: Callable[[random.Random], tuple[int, int]], rng: random.Random,
                    size: int = DECK_SIZE) -> list[tuple[int, int]]:
    """``size`` (prompt, output) lengths standing for the distribution ``draw`` samples, in a balanced order."""
    if size < 1:
        raise ValueError(f"a deck needs at least one card, got {size}")
    sample = [draw(rng) for _ in range(size * SAMPLE_PER_STRATUM)]
    prompts = _strata_means(sorted(p for p, _ in sample), size)
    outputs = _strata_means(sorted(o for _, o in sample), size)
    rng.shuffle(outputs)
    # NOTE: card k takes the prompt stratum at the golden-ratio point k * 0.618 (mod 1): consecutive
    # cards land far apart in the distribution, and any run of them covers it nearly evenly.
    order = sorted(range(size), key=lambda k: (k * _GOLDEN) % 1.0)
    ranks = [0] * size
    for rank, k in enumerate(order):
        ranks[k] = rank
    return [(prompts[ranks[k]], outputs[k]) for k in range(size)]


def _strata_means(values: list[int], size: int) -> list[int]:
    """The rounded mean of each of ``size`` equal-count strata of the sorted ``values``."""
    per = len(values) // size
    return [max(1, round(sum(values[i * per:(i + 1) * per]) / per)) for i in range(size)]
