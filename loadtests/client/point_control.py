"""How the orchestrator tells a running load point when its measured window opens and when it ends.

A point run with a stopping rule (:mod:`loadtests.point_stop`) does not know its warm-up or its
length in advance: the orchestrator watches the load and writes ``point_control.json`` into the run
directory, first with ``measure_from`` (the load is steady: requests sent from then on are
measured), then with ``stop_at`` (the throughput is known well enough: users send nothing after
it). Each time lies a little in the future when written (``LEAD_S``), so a worker that reads the
file a poll later still flags every request by the same time.

A lone Locust process reads the file itself; a master reads it and passes it on to its workers
(:data:`CONTROL_MESSAGE`), which may run on other machines.

Light on purpose (stdlib and the run directory's names): Locust's processes import it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from probes.run_dir import CONTROL_NAME

CONTROL_MESSAGE = "servescope_control"
# Seconds ahead of the decision the times are set, and how often a worker looks at the file:
# NOTE: POLL_S must stay well under LEAD_S, or a request could be sent before its worker knew its window.
LEAD_S = 0.5
POLL_S = 0.1


@dataclass(slots=True, frozen=True)
class PointControl:
    """The window a point's workers follow; None: not decided yet."""

    measure_from: float | None = None
    stop_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PointControl:
        return cls(data.get("measure_from"), data.get("stop_at"))


def read_control(run_dir: str | os.PathLike[str]) -> PointControl | None:
    """The control file of ``run_dir`` (written whole, by ``RunDirectory.save``), or None while there is none."""
    try:
        text = (Path(run_dir) / CONTROL_NAME).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return PointControl.from_dict(json.loads(text))
