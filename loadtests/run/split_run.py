"""One probed server, several load points: cut the server's probe tables into each point's run directory.

A capacity search keeps one server alive across its points (a restart per point would cost a
model load and a warm-up each). The server's probes write one run directory; when it has
stopped, :func:`split_server_run` gives every point's directory the rows that fall inside that
point's load (from ``load.json``'s ``started_at`` to ``finished_at``), a ``run.json`` naming the
point's own load, and the server's ``machine_peaks.json``, so each point reads as if it had had
its own server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from probes.loader import load_run
from probes.run_dir import LOAD_NAME, MANIFEST_NAME, PEAKS_NAME, RunDirectory
from probes.schemas import TABLE_SCHEMAS

# The column that places each engine-side table's rows in time.
TIME_COLUMNS = {"steps": "start_time", "requests": "arrival_time", "host": "time", "nvml": "time",
                "prometheus": "time"}


def split_server_run(server_dir: Path, point_dirs: list[Path]) -> None:
    """Write the rows of ``server_dir``'s tables that fall in each point's load into that point's directory."""
    run = load_run(server_dir)
    for point_dir in point_dirs:
        point = RunDirectory(point_dir)
        info = point.load_info()
        if info is None or info.started_at is None or info.finished_at is None:
            raise ValueError(f"{point_dir} has no finished load in {LOAD_NAME}, so its rows cannot be placed")
        for name, frame in run.frames.items():
            column = TIME_COLUMNS.get(name)
            if column is None:
                raise ValueError(f"{server_dir}: table {name!r} has no time column to split it by")
            inside = frame[(frame[column] >= info.started_at) & (frame[column] <= info.finished_at)]
            point.write_frame(name, inside, TABLE_SCHEMAS[name])
        manifest = run.manifest
        manifest.workload = info.to_dict()
        manifest.started_at, manifest.stopped_at = info.started_at, info.finished_at
        point.write_json(MANIFEST_NAME, manifest.to_dict())
        peaks = server_dir / PEAKS_NAME
        if peaks.is_file():
            shutil.copyfile(peaks, point_dir / PEAKS_NAME)
