"""How fast a load point's engine ran: its decode forwards against the step calibration, and against the search's
other points.

A point's **engine load factor** is its measured window's decode forwards over the calibrated forward at the same
batch sizes (:func:`reports.levers.step_model.load_factor` on the window's busy steps). It grows with the load up
to a few users (the load's client and the server's event loop take more of the cores) and then levels off; what
still moves it is the host's own speed. A point's **slowdown** is its factor over the search's median point's:
at :data:`SLOWED_FACTOR` or more the host, not the load, ran that point slower, and its throughput reads low.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from probes.run_dir import CALIBRATION_NAME, RunDirectory, RunFileError
from probes.step_calibration import StepCalibration
from reports.capacity.point import measured_window
from reports.capacity.records import Capacity
from reports.dataset import RunDataset
from reports.levers.step_model import busy_periods, load_factor

# A search's point whose engine load factor is this many times the search's median point's (:func:`slowdowns`) ran
# on a slower host, not under a heavier load: its throughput reads low (the report's capacity headline names it).
SLOWED_FACTOR = 1.15


def engine_load_factor(data: RunDataset, start: float, end: float) -> float | None:
    """One run's (or load point's) :func:`load_factor` over the busy steps that started in ``[start, end)``,
    against its own ``step_calibration.json``; None without the engine's steps, the calibration or a busy
    decode step there. It grows with the load on a shared machine (the load's workers and the server's event
    loop take more of the cores), so it is compared across runs at the same point (``studies/repeatability.py``)."""
    if not data.has_engine_probes:
        return None
    try:
        calibration = RunDirectory(data.path).load(CALIBRATION_NAME, StepCalibration)
    except (RunFileError, KeyError, TypeError, ValueError):
        return None
    busy = busy_periods(data.frame("steps"))
    busy = busy[(busy["start_time"] >= start) & (busy["start_time"] < end)]
    if calibration is None or not (busy["num_prefill_tokens"] == 0).any():
        return None
    return load_factor(busy, calibration)


def point_load_factor(data: RunDataset) -> float | None:
    """:func:`engine_load_factor` over the point's measured window (the one its throughput is counted over)."""
    window = measured_window(data)
    return engine_load_factor(data, *window) if window is not None else None


def slowdowns(factors: dict[int, float | None]) -> dict[int, float]:
    """Each point's engine load factor (users -> factor) over the median of the search's points from 2 users up;
    empty with fewer than three such points. One user's point is left out of the median and given none: with one
    stream the load's client and the server's event loop take the least of the cores, so its factor is the lowest
    by design. Past that the factor levels off, and what still moves it is the host's own speed, which on
    shared hardware drifts between points with nothing else running (docs/results.md, "The host's own drift")."""
    usable = {u: f for u, f in factors.items() if u > 1 and f is not None}
    if len(usable) < 3:
        return {}
    median = float(np.median(list(usable.values())))
    return {u: f / median for u, f in usable.items()}


def attach_engine_speed(capacity: Capacity, points: Sequence[RunDataset]) -> None:
    """Fill each capacity point's ``engine_load_factor`` and ``engine_slowdown`` from its run directory."""
    by_users = {int(p.concurrency): p for p in points if p.concurrency is not None}
    for point in capacity.points:
        data = by_users.get(point.users)
        point.engine_load_factor = point_load_factor(data) if data is not None else None
    ratios = slowdowns({p.users: p.engine_load_factor for p in capacity.points})
    for point in capacity.points:
        point.engine_slowdown = ratios.get(point.users)
