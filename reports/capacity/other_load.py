"""How much of the machine other processes took while a point measured: the noise a shared box adds.

A point run against our own probed server knows three CPU figures over its window: the whole
machine's (the host probe's system CPU), the server process's (the same probe) and the load
workers' (their health samples). What is left is other processes': on a shared 2-core machine, a
build or another benchmark taking half a core slows the server by more than half a core's worth
(its threads wait for each other), and the point's throughput then reads low. Only for our own
server: against an external one the host probe watches the load's process, not the target's.

Other processes are not the only way the shared box moves a point: the engine itself may run slower at
one point than at the next with no other process in sight (its team, the server's event loop and the
load workers on the same two cores). Each point also keeps its engine's load factor, how much slower its
decode forwards ran than the step calibration's at the same batch sizes: it grows with the load (the
workers and the event loop take more of the cores), so it is read against the same point of another run
(``studies/repeatability.py``), not against the search's other points.
"""

from __future__ import annotations

import numpy as np

from probes.run_dir import CALIBRATION_NAME, RunDirectory, RunFileError
from probes.step_calibration import StepCalibration
from reports.dataset import RunDataset
from reports.levers.step_model import busy_periods, load_factor

# Cores of other processes' work over a window above which the point is flagged as measured on a busy machine.
BUSY_CORES = 0.25


def other_cpu_cores(data: RunDataset, start: float, end: float) -> float | None:
    """Cores busy with anything but the server and the load's workers over ``[start, end]`` (time-averaged);
    None without the server's host samples or the workers' health samples in that window."""
    if not data.has_engine_probes:
        return None
    host = data.frame("host")
    host = host[(host["time"] > start) & (host["time"] <= end)]
    health = data.client_health
    if len(host) == 0 or health is None or len(health) == 0:
        return None
    health = health[(health["time"] > start) & (health["time"] <= end)]
    num_cores = max(len(cores) for cores in host["per_core_pct"] if cores is not None)
    machine = float(np.mean(host["system_cpu_pct"])) / 100 * num_cores
    server = float(np.mean(host["process_cpu_pct"])) / 100
    workers = float(health.groupby("worker")["cpu_share"].mean().sum()) if len(health) else 0.0
    return max(machine - server - workers, 0.0)


def engine_load_factor(data: RunDataset, start: float, end: float) -> float | None:
    """The point's loaded decode forward over the calibrated one at the same batch sizes
    (:func:`reports.levers.step_model.load_factor`) on the busy steps that started in ``[start, end)``; None
    without the engine's steps, its step calibration or any busy decode step there."""
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

