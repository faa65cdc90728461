"""A point's stopping rule on synthetic live counts with known noise: when it starts measuring and when it stops."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadtests.config import StopRule
from loadtests.point_stop import MIN_MEASURE_S, LiveProgress, PointMonitor
from reports.capacity.interval import batch_means_interval

SAMPLE_S = 0.2  # the workers' health samples (loadtests.client.health)
TOKENS_PER_REQUEST = 60


def _run(rates: np.ndarray, users: int | None, warmup_cap_s: float = 20.0, duration_cap_s: float = 40.0,
         decoding: np.ndarray | None = None) -> PointMonitor:
    """Feed a monitor one worker's samples of a load streaming ``rates[i]`` tokens/s in second ``i``, ticking
    once a second as the orchestrator does, until it decides the window's end or the rates run out. An open
    loop (``users`` None) keeps 8 requests in flight."""
    monitor = PointMonitor(StopRule(0.05), users, warmup_cap_s, duration_cap_s)
    progress = LiveProgress(Path("never-polled"))  # fed sample by sample below, as poll() would
    chunks = done = 0.0
    t0 = 1000.0
    for second, rate in enumerate(rates):
        for k in range(int(round(1 / SAMPLE_S))):
            chunks += rate * SAMPLE_S
            done += rate * SAMPLE_S / TOKENS_PER_REQUEST
            now = t0 + second + (k + 1) * SAMPLE_S
            progress.add({"worker": "w0", "time": now, "chunks": int(chunks), "in_flight": users or 8,
                          "decoding": int(decoding[second]) if decoding is not None else (users or 8) - 1,
                          "done": int(done)})
        monitor.decide(progress, t0 + second + 1.05)
        if monitor.is_done:
            break
    return monitor


def _stationary(rng: np.random.Generator, n: int, mean: float, relative_sd: float, phi: float = 0.5) -> np.ndarray:
    x = np.empty(n)
    x[0] = 0.0
    for i in range(1, n):
        x[i] = phi * x[i - 1] + rng.normal(0, relative_sd * mean * np.sqrt(1 - phi * phi))
    return np.maximum(mean + x, 0.0)


def test_measuring_starts_once_the_first_cohort_is_replaced_and_the_rate_is_steady() -> None:
    rng = np.random.default_rng(1)
    # 8 users: the rate climbs for 10 s (every user's first prefill at once), then holds at 100 tok/s.
    rates = np.concatenate([np.linspace(0, 100, 10), _stationary(rng, 80, 100.0, 0.03)])
    monitor = _run(rates, users=8)
    w = monitor.window
    assert w.is_steady and "steady" in w.why_started
    opened = w.measure_from - 1000.0
    assert 10 <= opened <= 20  # after the climb and one cohort (8 requests of 60 tokens: about 5 s more)


def test_a_rate_that_swings_by_its_noise_alone_is_steady() -> None:
    # 16 users on 2 cores: the token rate swings from 0 to 190 tok/s second to second (prefills stall
    # decodes), with no trend; halves that differ by that noise do not hold the window shut.
    rng = np.random.default_rng(4)
    monitor = _run(_stationary(rng, 60, 85.0, 0.65, phi=0.3), users=16)
    assert monitor.window.is_steady, monitor.window.why_started


def test_a_quiet_point_stops_once_its_interval_is_tight_and_a_noisy_one_at_its_cap() -> None:
    rng = np.random.default_rng(2)
    quiet = _run(_stationary(rng, 120, 100.0, 0.05), users=4)
    assert quiet.is_done and "within" in quiet.window.why_stopped
    measured = quiet.window.stop_at - quiet.window.measure_from
    assert MIN_MEASURE_S <= measured < 40.0
    assert quiet.window.live_interval is not None
    assert quiet.window.live_interval["high"] - quiet.window.live_interval["low"] <= 0.1 * 100.0 * 1.1
    noisy = _run(_stationary(rng, 120, 100.0, 0.4), users=4)
    assert "cap" in noisy.window.why_stopped and noisy.window.live_interval is None
    assert noisy.window.stop_at - noisy.window.measure_from == 40.0


def test_noisier_points_measure_longer() -> None:
    lengths = []
    for relative_sd in (0.03, 0.12):
        rng = np.random.default_rng(3)
        monitor = _run(_stationary(rng, 120, 100.0, relative_sd), users=4, duration_cap_s=100.0)
        lengths.append(monitor.window.stop_at - monitor.window.measure_from)
    assert lengths[0] < lengths[1]


def test_a_load_that_never_steadies_is_measured_from_the_warm_up_cap_and_says_so() -> None:
    rates = np.linspace(10, 200, 100)  # climbing throughout: a queue that never settles
    monitor = _run(rates, users=4, warmup_cap_s=15.0)
    w = monitor.window
    assert not w.is_steady and "did not steady" in w.why_started
    assert 15.0 <= w.measure_from - 1000.0 <= 17.0


def test_a_closed_loop_waits_past_the_cap_for_its_first_cohort_and_no_longer() -> None:
    """32 users (as the main job's heaviest points, 2026-12-07): 60 tokens a request at 75 tok/s, so the 32nd
    request is done after about 26 s; the 10 s cap alone opened the window while every user was still on its
    first request."""
    rng = np.random.default_rng(4)
    rates = np.concatenate([np.linspace(30, 75, 6), _stationary(rng, 75, 75.0, 0.05)])
    monitor = _run(rates, users=32, warmup_cap_s=10.0)
    steady = monitor.window
    done_at = np.searchsorted(np.cumsum(rates) / TOKENS_PER_REQUEST, 32) + 1  # the second its 32nd request ends
    assert done_at > 20 and steady.is_steady and done_at <= steady.measure_from - 1000.0 <= done_at + 2.0
    # the same load with its decoding count still doubling every 4 s (never steady): opened once the cohort is
    # replaced, and says so
    monitor = _run(rates, users=32, warmup_cap_s=10.0, decoding=2.0 ** (np.arange(len(rates)) / 4))
    w = monitor.window
    opened = w.measure_from - 1000.0
    assert not w.is_steady and "did not steady" in w.why_started and "replaced by" in w.why_started
    assert done_at <= opened <= done_at + 2.0
    # a cohort that is never replaced (requests longer than the whole wait) holds the window shut three caps
    slow = _run(np.full(60, 20.0), users=32, warmup_cap_s=10.0)
    assert 30.0 <= slow.window.measure_from - 1000.0 <= 31.6 and "not all replaced" in slow.window.why_started
    # an open loop has no cohort: the cap alone
    open_loop = _run(np.full(60, 20.0), users=None, warmup_cap_s=10.0, decoding=8 * 2.0 ** (np.arange(60) / 4))
    assert 10.0 <= open_loop.window.measure_from - 1000.0 <= 11.6


def test_the_interval_it_reports_covers_the_true_rate_at_its_stated_rate() -> None:
    # Stopping at the first tight interval favours intervals that came out too narrow; the rule's floors
    # keep the interval reported over the window it decided (recomputed, as reports.capacity.result does) honest.
    held = 0
    num_points = 120
    for seed in range(num_points):
        rng = np.random.default_rng(100 + seed)
        rates = _stationary(rng, 90, 100.0, 0.08)
        w = _run(rates, users=4, duration_cap_s=60.0).window
        first, last = round(w.measure_from - 1000.0), round(w.stop_at - 1000.0)
        reported = batch_means_interval(rates[first:last])
        assert reported is not None
        held += reported.low <= 100.0 <= reported.high
    assert held / num_points >= 0.92


def _context(is_controlled: bool, rate: float | None = None, seed: int = 0):  # noqa: ANN202 - LoadContext
    from loadtests.client.load_context import LoadContext
    from loadtests.client.records import Journal
    from loadtests.plan import PlannedRequest
    from loadtests.workloads.arrival import OpenLoopArrivals

    class Nowhere:
        def write_line(self, line: str) -> None: ...

        def close(self) -> None: ...

    return LoadContext(plan=[PlannedRequest(0, "hi", 1, 64)], journal=Journal(Nowhere()), model="m",
                       api="completions", worker_index=0, num_workers=1, warmup_s=20.0, duration_s=40.0,
                       ignore_eos=True, arrivals=OpenLoopArrivals(rate, 1.0, 1) if rate else None, seed=seed,
                       read_timeout_s=10.0, stop_timeout_s=10.0, is_controlled=is_controlled)


def test_a_controlled_closed_loop_cuts_each_users_first_request_at_a_seeded_random_share() -> None:
    shares = [_context(True).first_share() for _ in range(3)]
    assert shares[0] == shares[1] == shares[2]  # seeded: the same point sends the same first requests
    draws = [_context(True, seed=s).first_share() for s in range(200)]
    assert all(0 <= d < 1 for d in draws) and 0.4 < float(np.mean(draws)) < 0.6  # spread over a lifetime
    assert _context(False).first_share() is None  # a fixed schedule sends every request as planned
    assert _context(True, rate=2.0).first_share() is None  # an open loop has no cohort to break up


def test_a_controlled_point_follows_its_window_and_a_lost_orchestrator_is_bounded() -> None:
    from loadtests.client.point_control import PointControl
    from loadtests.config import COHORT_WAIT_FACTOR, CONTROL_SLACK_S

    context = _context(True)
    assert context.is_warmup(context.start_time + 100.0)  # no window yet: everything is warm-up
    # a closed loop may wait three warm-up caps for its first cohort, and then measure its whole duration cap
    assert context.deadline == context.start_time + COHORT_WAIT_FACTOR * 20.0 + 40.0 + CONTROL_SLACK_S
    open_loop = _context(True, rate=2.0)
    assert open_loop.deadline == open_loop.start_time + 20.0 + 40.0 + CONTROL_SLACK_S
    context.apply(PointControl(measure_from=context.start_time + 5.0, stop_at=context.start_time + 30.0))
    assert context.is_warmup(context.start_time + 4.9) and not context.is_warmup(context.start_time + 5.0)
    assert context.deadline == context.start_time + 30.0
    fixed = _context(False)
    assert not fixed.is_warmup(fixed.start_time + 20.0) and fixed.deadline == fixed.start_time + 60.0
