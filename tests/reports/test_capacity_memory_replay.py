"""A KV pool that admits about three requests, read from outside: memory, not compute (issue 33, item 5).

Real capacity searches (2026-12-06, the 2-core AMD EPYC box, under the CPU lock) against ``transformers serve
--continuous-batching --cb-block-size 16 --cb-num-blocks 32`` on the bundled GGUF, with the fixed workload (128
prompt + 32 output tokens, 10 pages a request; 3x: 30 of the 32 pages), ``--max-users 8 --interval 0 --warmup 5
--duration 20``, replayed from their recorded client rows (no server, no load):

- ``fixtures/capacity/tf-cb-32-blocks-first``: 12.8, 12.1, 13.2 output tok/s at 1, 2 and 4 users; at 2 users 92%
  of the open requests decoding (each at half speed: transformers' step at batch 2 took 136 ms against 66 ms alone),
  at 4 users one of four waiting. It read compute (``capacity_compute`` at 2 users) and ran no tokens experiment.
- ``fixtures/capacity/tf-cb-32-blocks``: the same command later (10:06 UTC): capacity 3 users, requests queued at 4,
  and the tokens experiment at 3 users: 3x the tokens gave 0.37x the decoding streams.

With the server's default pool (364 pages) the throughput rose 3x by 8 users: the pool is the lever.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from loadtests.capacity import tokens_experiment_users
from reports.capacity.limit import capacity_limit
from reports.capacity.records import Capacity, Limit, TokensExperiment
from reports.verdict.diagnosis import analyze, decide

FIXTURES = Path(__file__).parent / "fixtures" / "capacity"


def test_all_decoding_past_the_capacity_but_queued_further_asks_for_the_tokens_experiment_there() -> None:
    capacity = analyze(FIXTURES / "tf-cb-32-blocks-first", view="outside").capacity
    assert capacity is not None and capacity.concurrency == 1 and capacity.past_knee_users == 2
    assert capacity.queue_share_past_knee is not None and capacity.queue_share_past_knee >= 0.8
    four = next(p for p in capacity.points if p.users == 4)
    assert four.decoding_streams is not None and four.in_flight and four.decoding_streams / four.in_flight < 0.8
    assert tokens_experiment_users(capacity, plateaued=True) == 4  # the search stopped on its plateau
    assert tokens_experiment_users(capacity, plateaued=False) is None  # at --max-users, still rising: no reading
    assert capacity.limit == "compute"  # without the experiment, what it read


def test_streams_that_fall_with_longer_requests_read_cache() -> None:
    analysis = analyze(FIXTURES / "tf-cb-32-blocks", view="outside")
    capacity = analysis.capacity
    assert capacity is not None and capacity.tokens is not None and capacity.tokens.users == 3
    assert capacity.tokens.exponent >= 0.5 and capacity.limit == "memory"
    assert analysis.diagnosis.bottleneck == "cache" and analysis.diagnosis.deciding == ["capacity_memory"]


def test_memory_found_past_a_compute_reading_comes_first_a_seat_limit_does_not() -> None:
    analysis = analyze(FIXTURES / "tf-cb-32-blocks-first", view="outside")
    assert analysis.capacity is not None and analysis.diagnosis.deciding == ["capacity_compute"]

    def at_four(limit: Limit, streams_ratio: float, exponent: float) -> Capacity:
        tokens = TokensExperiment(users=4, token_ratio=3.0, streams_ratio=streams_ratio, exponent=exponent, limit=limit)
        return dataclasses.replace(analysis.capacity, tokens=tokens)

    memory, seats = at_four("memory", 0.37, 0.9), at_four("seats", 1.0, 0.0)
    assert capacity_limit(memory)[0] == "memory" and capacity_limit(seats)[0] == "compute"
    cache = decide(dataclasses.replace(analysis.facts, capacity=memory))
    assert cache.bottleneck == "cache" and cache.deciding == ["capacity_memory"] and "at 4 users" in cache.summary
    compute = decide(dataclasses.replace(analysis.facts, capacity=seats))
    assert compute.bottleneck == "execution" and compute.deciding == ["capacity_compute"]
