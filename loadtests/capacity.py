"""The capacity search: find the concurrency where a server's output throughput stops rising.

Closed-loop users start at 1 and double until throughput has failed to rise ``MIN_RISE`` times
over the best point before it on ``PLATEAU_POINTS`` doublings in a row; then the midpoints on both sides of the
capacity the doubling points give (:func:`refine_around`) are filled in, so every run names its
capacity between neighbours measured at the search's finest step. When requests queue past the
knee, the capacity point is rerun with ``TOKENS_SCALE`` times the tokens per request (the tokens
experiment, reports.capacity.limit), which
tells a seat limit from a memory limit. Each point is an ordinary run directory ``OUT/users-N``;
``OUT/sweep.json`` lists them and ``OUT/capacity.json`` records the search. A point that cannot
be judged (reports.health) stops the search; so does a point whose requests fail from overload
(dropped, refused as busy, timed out, out of context or KV cache: reports.failures), which stays in
the sweep as the evidence of the limit it found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from loadtests.config import DEFAULT_MAX_USERS, LoadConfig
from loadtests.errors import RunFailedError
from probes.manifest import RunStatus
from probes.peaks import MachinePeaks
from probes.run_dir import CAPACITY_NAME, SWEEP_NAME, RunDirectory, SweepIndex, SweepPoint
from reports.capacity.bootstrap import weights_of
from reports.capacity.interval import RateInterval
from reports.capacity.limit import UNQUEUED_DECODING_SHARE, is_serial
from reports.capacity.other_load import BUSY_CORES
from reports.capacity.records import Capacity, CapacitySearch
from reports.capacity.result import capacity_result, focus_users
from reports.capacity.saturation import choose_users
from reports.dataset import RunDataset
from reports.health import point_failures
from reports.summary import point_measures

# A doubling rises when its throughput is at least this many times the best point's before it. Against the
# best so far, not the last rise: one point read high (a 4-user point 10% over its curve) then held the next
# two to 1.15x and 1.32x over it, and 5 of the 7 runs of the main job that stopped doubling at 16 users
# (2026-12-07) stopped while 16 gained 1.16-1.25x over 8. A slow creep past a seat limit (under 1.15x a
# doubling) is still no rise; two in a row end the search.
MIN_RISE = 1.15
# Doubling stops after this many doublings in a row without a rise: one point that gains little, or
# even less than the point before (a transient, a batch size the engine handles badly, a draw of long
# prompts), does not end the search.
PLATEAU_POINTS = 2
# The tokens experiment asks for this many times the tokens per request (prompt and output).
TOKENS_SCALE = 3.0
TOKENS_DIR = "tokens-x3"

RunPoint = Callable[[LoadConfig, Path], None]  # runs one load point into a new run directory


@dataclasses.dataclass(slots=True)
class _Measured:
    users: int
    output_tokens_per_s: float
    slo_ok: bool | None  # None without an SLO
    interval: RateInterval | None = None
    measured_s: float | None = None
    other_cpu_cores: float | None = None

    def words(self) -> str:
        """``8 users: 96.5 ± 3.1 output tok/s (95%: 93.4-99.6, 24 s measured)``."""
        i = self.interval
        if i is None:
            return f"{self.users} users: {self.output_tokens_per_s:.1f} output tok/s"
        busy = (f"; other processes took {self.other_cpu_cores:.1f} cores"
                if (self.other_cpu_cores or 0) >= BUSY_CORES else "")
        return (f"{self.users} users: {self.output_tokens_per_s:.1f} ± {i.half_width:.1f} output tok/s "
                f"({i.confidence:.0%}: {i.low:.1f}-{i.high:.1f}"
                + (f", {self.measured_s:.0f} s measured" if self.measured_s is not None else "") + busy + ")")


def search_capacity(base: LoadConfig, out: Path, run_at: RunPoint, console: Console, *,
                    max_users: int = DEFAULT_MAX_USERS, model_bytes: int | None = None,
                    is_local: bool = False, slo_attainment: float | None = None,
                    peaks: MachinePeaks | None = None, probed: bool = False) -> CapacitySearch:
    """Run the search into ``out`` (new or empty); returns what it ran (also in ``out/capacity.json``).

    ``probed``: the engine's probes watch the server, so they tell what limits it and the tokens
    experiment (a point at 3x the tokens, slow to drain) is not run.
    """
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; give --out a new directory")
    if max_users < 2:
        raise ValueError(f"--max-users must be >= 2 for a capacity search, got {max_users}")
    out.mkdir(parents=True, exist_ok=True)
    if peaks is not None:
        RunDirectory(out).write_peaks(peaks)
    search = CapacitySearch(order=[], stopped="", model_bytes=model_bytes, is_local=is_local, probed=probed)
    if slo_attainment is not None:
        search.slo_attainment = slo_attainment
    measured: dict[int, _Measured] = {}

    def run(users: int) -> _Measured | None:
        # NOTE: every point sends the same seeded request sequence, so which prompts land in a window differs
        # between points (and between runs) only by how fast they are served, not by the draw.
        config = base.at_point("users", users)
        run_dir = out / config.point_name
        console.rule(f"capacity search: {users} user{'s' if users > 1 else ''}")
        run_at(config, run_dir)
        overloaded = overloaded_point(run_dir)
        if overloaded is not None:
            # NOTE: kept out of sweep.json: the search and its verdict stand on the points measured before it.
            search.overloaded.append({"users": users, "dir": config.point_name, "why": overloaded})
            console.print(f"{users} users: {overloaded}")
            return None
        search.order.append(users)
        _write_index(out, search)
        point, failed = _measure(run_dir, search.slo_attainment)
        if point is not None:
            measured[users] = point
            console.print(point.words() + ("" if point.slo_ok is None else f", SLO {'held' if point.slo_ok else 'missed'}"),
                          highlight=False)
        if point is not None and failed is not None and search.failed_at is None:
            search.failed_at = {"users": users, "dir": config.point_name, "why": failed}
            console.print(f"{users} users: {failed}: read as overload, the limit this load found")
        return point

    users, doubled, plateaued = 1, [], False
    while True:
        point = run(users)
        if point is None and _was_overloaded(search, users) and search.order:
            last_rise = doubling_plateau(doubled)[0]
            search.stopped = (f"users-{users} was {search.overloaded[-1]['why']}; the search stopped there and "
                              f"judges the points before it")
            break
        if point is None and not search.order:
            # NOTE: nothing measured at all (its one point overloaded): no report to write, so say it here.
            search.stopped = f"users-{users} was {search.overloaded[-1]['why']}; nothing was measured"
            _save(out, search)
            raise RunFailedError(f"the capacity search in {out} measured nothing: its first point, users-{users}, was "
                                 f"{search.overloaded[-1]['why']}; is the machine busy? (see "
                                 f"{out / f'users-{users}' / 'locust.log'})")
        if point is None:
            search.stopped = f"users-{users} could not be judged (see its failures); the search stopped there"
            return _save(out, search)
        doubled.append((users, point.output_tokens_per_s))
        last_rise, plateau = doubling_plateau(doubled)
        if search.failed_at is not None and search.failed_at["users"] == users:
            search.stopped = (f"users-{users}: {search.failed_at['why']}; overload is the limit, so the search "
                              f"stopped there")
            break
        if plateau is not None:
            search.stopped, plateaued = plateau, True
            break
        if point.slo_ok is False:
            search.stopped = f"the SLO was missed at {users} users"
            break
        if users * 2 > max_users:
            search.stopped = f"reached --max-users {max_users}" + (
                " with throughput still rising" if last_rise == users else "")
            break
        users *= 2
    # NOTE: every point in search.order was measured (one that could not be judged returned above), so the
    # refining has points to go around.
    for users in refine_points([*measured, *(o["users"] for o in search.overloaded)],
                               refine_around(list(measured.values()))):
        if run(users) is None and not _was_overloaded(search, users):
            search.stopped += f"; the refining point users-{users} could not be judged"
            return _save(out, search)
    past = point_past_the_top(list(measured), refine_around(list(measured.values())), max_users) \
        if plateaued and not search.overloaded else None
    if past is not None and run(past) is None and not _was_overloaded(search, past):
        search.stopped += f"; the point past the capacity, users-{past}, could not be judged"
        return _save(out, search)
    _save(out, search)
    tokens_users = None if probed else tokens_experiment_users(_current(out, search), plateaued)
    if tokens_users is not None:
        config = dataclasses.replace(base.at_point("users", tokens_users), token_scale=TOKENS_SCALE,
                                     seed=base.seed + len(search.order))
        console.rule(f"tokens experiment: {tokens_users} users, {TOKENS_SCALE:g}x the tokens per request")
        run_at(config, out / TOKENS_DIR)
        search.tokens_dir, search.tokens_scale = TOKENS_DIR, TOKENS_SCALE
    return _save(out, search)


def doubling_plateau(points: list[tuple[int, float]]) -> tuple[int, str | None]:
    """Over the doubling points so far, ``(users, output tok/s)`` in the order run: the users of the
    last point that rose, and why the doubling stops there (None while it goes on).

    A point rises when its throughput is at least ``MIN_RISE`` times the best before it (the first point
    is one); the search stops after ``PLATEAU_POINTS`` points in a row that did not.
    """
    rise_users, best, misses, short = points[0][0], points[0][1], 0, []
    for users, tps in points[1:]:
        if tps >= MIN_RISE * best:
            rise_users, misses, short = users, 0, []
        else:
            misses += 1
            short.append(f"{tps:.1f} at {users} over {best:.1f}")
        best = max(best, tps)
    if misses < PLATEAU_POINTS:
        return rise_users, None
    return rise_users, (f"throughput rose less than {MIN_RISE:.2f}x over the best point before it on {misses} "
                        f"doublings in a row ({', '.join(short)}; the last rise at {rise_users} users)")


def refine_around(points: list[_Measured]) -> int:
    """The users the refining points go around: the capacity the points measured so far give (with an SLO, the
    most users whose SLO held, the lightest when none did; else the plateau rule of reports.capacity.saturation,
    each point weighted by its precision).

    NOTE: not the doubling's last rise: on a curve that bends by degrees whether a doubling counts as a rise is a
    coin toss at its threshold, and runs that filled in different midpoints named capacities only on the points
    each had (one run without a 12-user point could only name 8 or 16); around the capacity, the points next to
    it are measured in every run.
    """
    ordered = sorted(points, key=lambda p: p.users)
    if any(p.slo_ok is not None for p in ordered):
        held = [p.users for p in ordered if p.slo_ok]
        return max(held) if held else ordered[0].users
    return choose_users([p.users for p in ordered], [p.output_tokens_per_s for p in ordered],
                        weights_of([p.interval for p in ordered]))


def refine_points(measured: list[int], around: int) -> list[int]:
    """Users to add around ``around`` (the capacity so far, :func:`refine_around`): the midpoints between it and
    its measured neighbours, so it has points on both sides at the search's finest step."""
    below = max((u for u in measured if u < around), default=None)
    above = min((u for u in measured if u > around), default=None)
    out = []
    for lo, hi in ((below, around), (around, above)):
        if lo is None or hi is None:
            continue
        mid = round((lo + hi) / 2)
        if lo < mid < hi and mid not in measured:
            out.append(mid)
    return out


def point_past_the_top(measured: list[int], around: int, max_users: int) -> int | None:
    """Users to add past a capacity (``around``, after the refining) at the heaviest point measured: the midpoint
    toward the doubling the plateau left out; None when the capacity has a point past it or none may be added.

    NOTE: what holds a server at its capacity is read past it (its queue, its batch); a search whose refined
    capacity lands on its last point says nothing of it. The fifteenth hold's second run (2026-12-07) stopped
    doubling at 16 users, filled in 12, whose reading then named 16, and its verdict was "not known"."""
    top = max(measured, default=None)
    if top is None or around != top:
        return None
    past = round((top + min(2 * top, max_users)) / 2)
    return past if top < past <= max_users else None


def overloaded_point(run_dir: Path) -> str | None:
    """Why a point measured nothing because the server was overloaded, or None when it was not.

    Overloaded: every request the point sent succeeded, but all were sent in the warm-up (closed-loop
    users wait for their first answer) and none ended before the window closed: each took longer than
    the whole point. Nothing failed, so the search is not broken; this load is past what it can judge.
    """
    from loadtests.client.table import load_client_requests

    try:
        rows = load_client_requests(run_dir)
    except FileNotFoundError:
        return None
    if rows.empty or not rows["is_ok"].astype(bool).all() or not rows["is_warmup"].astype(bool).all():
        return None
    first = float(rows["send_time"].min())
    return (f"overloaded: all {len(rows)} requests were sent in the warm-up, so none was measured; they ended "
            f"{float(rows['end_time'].min()) - first:.0f}-{float(rows['end_time'].max()) - first:.0f} s after the "
            f"first was sent, and all succeeded")


def _measure(run_dir: Path, slo_attainment: float) -> tuple[_Measured | None, str | None]:
    """The point's throughput (and whether its SLO held), None when it cannot be judged; and, when its
    requests failed from overload past reports.health's share, those failures in words."""
    from reports.capacity.point import capacity_point

    data = RunDataset.load(run_dir)
    measures = point_measures(data)
    if data.manifest is not None and data.manifest.status is RunStatus.FAILED:
        return None, None
    c = measures.client
    if (c is None or c.num_requests == 0) and (measures.server is None or measures.server.num_steps == 0):
        return None, None
    verdict, counts = point_failures(data, measures)
    if verdict == "broken":
        return None, None
    point = capacity_point(data, measures)
    slo_ok = None if point.slo_attainment is None else point.slo_attainment["value"] >= slo_attainment
    failed = counts.describe() if verdict == "overload" and counts is not None else None
    return _Measured(point.users, point.output_tokens_per_s or 0.0, slo_ok, point.interval, point.measured_s,
                     point.other_cpu_cores), failed


def verdict_users(out: Path, search: CapacitySearch) -> int:
    """The users of the point the verdict is read at (the first past the capacity, where its limit binds),
    so that evidence timed after the load (the outside execution reference) is timed at that point's batch."""
    return focus_users(_current(out, search), sorted(search.order))


def _was_overloaded(search: CapacitySearch, users: int) -> bool:
    return any(o["users"] == users for o in search.overloaded)


def _current(out: Path, search: CapacitySearch) -> Capacity:
    points = sorted((RunDataset.load(out / f"users-{u}") for u in search.order), key=lambda d: d.concurrency or 0)
    return capacity_result(out, search, points, [point_measures(p) for p in points])


def tokens_experiment_users(capacity: Capacity, plateaued: bool) -> int | None:
    """The users to rerun at 3x the tokens per request, or None for no tokens experiment.

    When requests queue past the capacity (and the server is not serial), the capacity point: seats or memory
    hold them there. When every open request decoded past the capacity (it reads as compute), or no point past
    it was measured, and the search stopped because more users stopped adding throughput (``plateaued``; not at
    --max-users with throughput still rising), the heaviest point from the capacity on where requests queued:
    a compute limit admits every request, so something else admitted only some there. transformers serve
    --continuous-batching on a KV pool of three requests was flat from 1 to 4 users, all decoding at 2 users,
    one of four waiting at 4: the pool was the lever (its default pool tripled the throughput by 8 users).
    """
    if capacity.concurrency is None or is_serial(capacity):
        return None
    share = capacity.queue_share_past_knee
    if share is not None and share < UNQUEUED_DECODING_SHARE:
        return capacity.concurrency
    if not plateaued:
        return None
    queued = [p.users for p in capacity.points if p.users >= capacity.concurrency and p.in_flight
              and p.decoding_streams is not None and p.decoding_streams / p.in_flight < UNQUEUED_DECODING_SHARE]
    return max(queued) if queued else None


def _write_index(out: Path, search: CapacitySearch) -> None:
    users = sorted(search.order)
    RunDirectory(out).save(SWEEP_NAME, SweepIndex("users", [SweepPoint(float(u), f"users-{u}") for u in users]))


def _save(out: Path, search: CapacitySearch) -> CapacitySearch:
    RunDirectory(out).save(CAPACITY_NAME, search)
    return search
