"""One row per engine step: where its wall time went and the batch and KV state it left."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from probes import schemas
from probes.base import columns_table
from probes.engine_probe import EngineProbe

if TYPE_CHECKING:
    from engine.observer import StepStats

# NOTE: the schema's columns are StepStats's fields plus total_s; a field the engine drops fails here
# at the first flush rather than silently writing nulls.
_STAT_FIELDS = tuple(name for name in schemas.STEPS.names if name != "total_s")


class StepProbe(EngineProbe):
    """Writes ``steps``: the engine's :class:`~engine.observer.StepStats`, one row per step.

    Phase times are what the engine measured: ``time.perf_counter`` around each phase on the host
    (CPU runs, and the GPU runner that synchronizes before sampling). A GPU runner timing its
    kernels with CUDA events will report those instead; :attr:`timer` names the kind and
    goes to ``run.json`` under ``timers``.
    """

    name = "steps"
    schema = schemas.STEPS
    timer = "perf_counter"

    def on_step(self, stats: StepStats) -> None:
        # NOTE: keeps the engine's object: it builds a fresh StepStats per step and never touches it again.
        self._rows.append(stats)

    def _to_table(self, rows: list[StepStats], is_final: bool) -> pa.Table:
        columns = {name: [getattr(s, name) for s in rows] for name in _STAT_FIELDS}
        columns["total_s"] = [s.total_s for s in rows]
        return columns_table(self.schema, columns)
