"""What limits a server at its capacity, by experiment from the outside.

No gain from 1 user to any heavier point is a serial server; past the knee, requests that all decode
(none queued) mean the work saturates the device; a queue whose decoding streams fall in proportion
to tokens per request (the tokens experiment) is memory, one that keeps the same number of streams
is a seat limit.
"""

from __future__ import annotations

import math
from pathlib import Path

from reports.capacity.point import capacity_point
from reports.capacity.records import Capacity, CapacityPoint, CapacitySearch, Limit, TokensExperiment
from reports.dataset import RunDataset

# The best throughput at more than 1 user over the throughput at 1 below this ratio: more users never
# became more throughput, so the server serves one request at a time. (Not 1 to 2 users alone: a
# batching server may gain nothing at 2 users and then scale, as transformers serve's continuous
# batching did on this machine, 12.8 tok/s at 1 and 2 users, 37.8 at 8.)
SERIAL_GAIN = 1.2
# Past the knee, at least this share of the open requests decoding at once: nothing queues them.
UNQUEUED_DECODING_SHARE = 0.8
# A serial server decodes one stream at a time: the client never sees this many decoding at once
# (time-averaged, at any point). A server that streams two at once is not serial, whatever its
# throughput did (transformers serve --continuous-batching with a KV pool of two requests: flat from
# 1 to 6 users, two streams at a time: memory, not seats, held it).
SERIAL_MAX_STREAMS = 1.5
LIMIT_BOTTLENECK: dict[str, str] = {"serial": "batching", "seats": "batching", "memory": "cache",
                                    "compute": "execution"}


def serial_gain(throughput_by_users: dict[int, float | None]) -> float | None:
    """The best output throughput at more than 1 user over the throughput at 1 (None without both)."""
    one = throughput_by_users.get(1)
    more = [t for u, t in throughput_by_users.items() if u > 1 and t is not None]
    return max(more) / one if one and more else None


def tokens_experiment(root: Path, search: CapacitySearch, by_users: dict[int, CapacityPoint]) -> TokensExperiment | None:
    """The tokens experiment's point against the same users' point of the search (None without both)."""
    if search.tokens_dir is None or not (root / search.tokens_dir).is_dir():
        return None
    from reports.summary import point_measures

    data = RunDataset.load(root / search.tokens_dir)
    measured = capacity_point(data, point_measures(data))
    base = by_users.get(measured.users)
    if base is None or not base.decoding_streams or not measured.decoding_streams or not base.tokens_per_request \
            or not measured.tokens_per_request:
        return None
    token_ratio = measured.tokens_per_request / base.tokens_per_request
    streams_ratio = measured.decoding_streams / base.decoding_streams
    if token_ratio <= 1.2:
        return None
    exponent = math.log(1 / streams_ratio) / math.log(token_ratio)
    return TokensExperiment(users=measured.users, token_ratio=token_ratio, streams_ratio=streams_ratio,
                            exponent=exponent, limit="memory" if exponent >= 0.5 else "seats")


def is_serial(c: Capacity) -> bool:
    """Flat throughput from 1 user on, and never two streams decoding at once."""
    return (c.serial_gain is not None and c.serial_gain < SERIAL_GAIN
            and (c.max_decoding_streams is None or c.max_decoding_streams < SERIAL_MAX_STREAMS))


def is_compute(c: Capacity) -> bool:
    """Past the capacity, every open request decoding (time-averaged): none queued for seats or memory."""
    return c.queue_share_past_knee is not None and c.queue_share_past_knee >= UNQUEUED_DECODING_SHARE


def capacity_limit(c: Capacity) -> tuple[Limit | None, str]:
    """What limits the capacity, and the evidence in words (None where the outside cannot tell)."""
    if is_serial(c):
        return "serial", (f"throughput grew at most {c.serial_gain:.2f}x from 1 user to any heavier point (under "
                          f"{SERIAL_GAIN}x) and at most {c.max_decoding_streams or 1:.2f} streams decoded at once: "
                          f"the server serves one request at a time")
    t = c.tokens
    # NOTE: memory before compute: past a compute reading a tokens experiment runs only where a heavier point
    # queued (loadtests.capacity.tokens_experiment_users), and streams that fall with longer requests there
    # mean memory admitted fewer; a seat limit found there comes after compute (seats filled past saturation).
    if t is not None and t.limit == "memory":
        return "memory", (f"at {t.users} users, {t.token_ratio:.1f}x the tokens per request gave {t.streams_ratio:.2f}x "
                          f"the decoding streams; the decoding streams fell in proportion: the KV cache (memory) "
                          f"holds fewer requests")
    if is_compute(c):
        return "compute", (f"past the capacity, at {c.past_knee_users} users, {c.queue_share_past_knee:.0%} of the open "
                           f"requests were decoding at once: none queued, each got slower, so the work itself "
                           f"saturates the device")
    if t is not None:
        return t.limit, (f"at {t.users} users, {t.token_ratio:.1f}x the tokens per request gave {t.streams_ratio:.2f}x "
                         f"the decoding streams; the same number of requests kept decoding: a seat limit (max sequences)")
    if c.method == "undetermined":
        where = (f"past the measured curve's own estimate, at {c.past_knee_users} users" if c.past_knee_users is not None
                 else "at the heaviest point")
        return None, (f"no capacity was named (its points cannot be told apart), so no capacity rule is read; the "
                      f"verdict is read {where} (where that point leaves the limit undecided, or the host ran the "
                      f"engine slower there, at the heaviest lighter one that decides it)")
    if c.queue_share_past_knee is not None and c.probed:
        return None, (f"past the capacity {c.queue_share_past_knee:.0%} of the open requests were decoding: requests "
                      f"queue; the engine's probes say why (the verdict, read at {c.past_knee_users} users)")
    if c.queue_share_past_knee is not None:
        return None, (f"past the capacity {c.queue_share_past_knee:.0%} of the open requests were decoding: requests "
                      f"queue, but no tokens experiment says whether for seats or memory")
    return None, "no point past the capacity was measured, so what holds it is not known from the outside"

