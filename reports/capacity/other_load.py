"""How much of the machine other processes took while a point measured: the noise a shared box adds.

A point run against our own probed server knows three CPU figures over its window: the whole
machine's (the host probe's system CPU), the server process's (the same probe) and the load
workers' (their health samples). What is left is other processes': on a shared 2-core machine, a
build or another benchmark taking half a core slows the server by more than half a core's worth
(its threads wait for each other), and the point's throughput then reads low. Only for our own
server: against an external one the host probe watches the load's process, not the target's.
"""

from __future__ import annotations

import numpy as np

from reports.dataset import RunDataset

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
