"""One run directory as the report sees it: probe frames, client rows, the load and the request plan.

Reports read runs only through :meth:`RunDataset.load`. Everything is optional except that the
directory holds *something* measured: a run of our server has engine probes (``steps``,
``requests``); an external server's run has client rows, host samples and perhaps ``/metrics``
scrapes; an in-process run may have probes alone.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from probes.loader import RunDataError, load_run
from probes.manifest import RunManifest
from probes.model_shape import ModelShape
from probes.peaks import MachinePeaks
from probes.run_dir import (
    CLIENT_HEALTH_TABLE,
    CLIENT_TABLE,
    LOCUST_STATS_NAME,
    MANIFEST_NAME,
    PLAN_NAME,
    LoadInfo,
    RunDirectory,
    RunFileError,
    SweepIndex,
)
from probes.schemas import CLIENT_HEALTH, CLIENT_REQUESTS, TABLE_SCHEMAS

# How much of a prompt the report shows next to a request (the rest is in workload.jsonl).
PROMPT_EXCERPT_CHARS = 160


class DatasetError(ValueError):
    """A directory the report cannot read; the message says what is missing."""


@dataclass(slots=True)
class RunDataset:
    """One load point's run directory, loaded.

    ``latencies`` holds one row per measured request (warm-up left out) with ``ttft_s``,
    ``tpot_s``, ``e2e_s``, ``itl_s`` and token counts, taken from the client rows when there are
    any (what users saw) and otherwise from the engine's request probe.
    """

    path: Path
    manifest: RunManifest | None
    frames: dict[str, pd.DataFrame]
    client: pd.DataFrame | None
    load_info: LoadInfo | None
    peaks: MachinePeaks | None = None
    prompts: dict[int, str] = field(default_factory=dict)
    locust_stats: pd.DataFrame | None = None
    client_health: pd.DataFrame | None = None  # the load workers' own samples (probes.schemas.CLIENT_HEALTH)
    window: tuple[float, float] = (math.nan, math.nan)
    latencies: pd.DataFrame = field(default_factory=pd.DataFrame)
    latency_source: str = "none"

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunDataset:
        """Load the run directory at ``path``; raises :class:`DatasetError` when it holds no run."""
        path = Path(path)
        if not path.is_dir():
            raise DatasetError(f"{path}: no such directory")
        manifest, frames = None, {}
        if (path / MANIFEST_NAME).is_file():
            try:
                run = load_run(path)
            except RunDataError as exc:
                raise DatasetError(str(exc)) from exc
            manifest, frames = run.manifest, run.frames
        client_path = path / f"{CLIENT_TABLE}.parquet"
        client = _read_client_rows(client_path) if client_path.is_file() else None
        if manifest is None and client is None:
            raise DatasetError(f"{path} is not a run directory: it has neither {MANIFEST_NAME} nor "
                               f"{CLIENT_TABLE}.parquet")
        run_dir = RunDirectory(path)
        try:
            load, peaks = run_dir.load_info(), run_dir.read_peaks()
        except (RunFileError, KeyError, TypeError) as exc:
            raise DatasetError(f"{path}: {exc}") from exc
        stats_path = path / LOCUST_STATS_NAME
        dataset = cls(path=path, manifest=manifest, frames=frames, client=client, load_info=load, peaks=peaks,
                      prompts=_read_prompts(path / PLAN_NAME),
                      locust_stats=pd.read_csv(stats_path) if stats_path.is_file() else None,
                      client_health=_read_client_health(run_dir.table_path(CLIENT_HEALTH_TABLE)))
        dataset.window = dataset._measurement_window()
        dataset.latencies, dataset.latency_source = dataset._latencies()
        return dataset

    # -- what the run holds -------------------------------------------------------------------
    def frame(self, name: str) -> pd.DataFrame:
        """Table ``name``, or an empty frame with its columns when the run has none."""
        if name in self.frames:
            return self.frames[name]
        return TABLE_SCHEMAS[name].empty_table().to_pandas()

    @property
    def has_engine_probes(self) -> bool:
        return len(self.frame("steps")) > 0

    @property
    def has_prometheus(self) -> bool:
        return len(self.frame("prometheus")) > 0

    @property
    def engine_config(self) -> dict[str, Any]:
        return dict(self.manifest.engine_config or {}) if self.manifest is not None else {}

    @property
    def model(self) -> str | None:
        if self.manifest is not None and self.manifest.model:
            return self.manifest.model
        return self.load_info.model if self.load_info is not None else None

    @property
    def model_shape(self) -> ModelShape | None:
        """The served model's shape as the run recorded it (None for a model unknown where the run started)."""
        return self.manifest.model_shape if self.manifest is not None else None

    @property
    def load_config(self) -> dict[str, Any]:
        """The load point's settings (``LoadConfig.to_dict()``), else what run.json says of the workload."""
        if self.load_info is not None:
            return self.load_info.config
        if self.manifest is not None and isinstance(self.manifest.workload, dict):
            return self.manifest.workload.get("config", self.manifest.workload)
        return {}

    @property
    def label(self) -> str:
        return str(self.load_config.get("point") or self.path.name)

    @property
    def concurrency(self) -> float | None:
        """Closed-loop users, else the open-loop rate (what a sweep varies)."""
        config = self.load_config
        value = config.get("users") if config.get("users") is not None else config.get("rate")
        return float(value) if value is not None else None

    @property
    def window_s(self) -> float:
        start, end = self.window
        return end - start if math.isfinite(start) and math.isfinite(end) and end > start else 0.0

    def steps_in_window(self) -> pd.DataFrame:
        """Engine steps that started inside the measurement window, in order."""
        steps = self.frame("steps").sort_values("start_time")
        start, end = self.window
        if math.isfinite(start) and math.isfinite(end):
            steps = steps[(steps["start_time"] >= start) & (steps["start_time"] <= end)]
        return steps.reset_index(drop=True)

    def prompt_excerpt(self, plan_index: Any) -> str | None:
        """The start of the prompt a client row sent (its ``plan_index`` in ``workload.jsonl``), if known."""
        if plan_index is None or pd.isna(plan_index) or int(plan_index) not in self.prompts:
            return None
        text = self.prompts[int(plan_index)]
        return text if len(text) <= PROMPT_EXCERPT_CHARS else text[:PROMPT_EXCERPT_CHARS] + "…"

    # -- derived ------------------------------------------------------------------------------
    def _measurement_window(self) -> tuple[float, float]:
        """First measured send to last measured finish (client rows), else the span of the steps."""
        if self.client is not None and len(self.client):
            measured = self.client[~self.client["is_warmup"]]
            if len(measured):
                ends = measured["end_time"].dropna()
                if len(ends):
                    return float(measured["send_time"].min()), float(ends.max())
                # NOTE: no measured request finished (all in flight when the load stopped): the load's measured
                # period, over which their tokens count by their progress
                duration = float(self.load_config.get("duration_s") or 0.0)
                start = float(self.client["send_time"].min()) + float(self.load_config.get("warmup_s") or 0.0)
                if duration > 0:
                    return start, start + duration
                return float(measured["send_time"].min()), float(measured["send_time"].max())
        requests = self.frame("requests")
        if len(requests):
            ends = requests["finish_time"].dropna()
            return float(requests["arrival_time"].min()), float(ends.max()) if len(ends) else math.nan
        steps = self.frame("steps")
        if len(steps):
            return float(steps["start_time"].min()), float((steps["start_time"] + steps["total_s"]).max())
        return math.nan, math.nan

    # NOTE: what only a client row holds: its retry, and the server's own timings from the stream.
    def _latencies(self) -> tuple[pd.DataFrame, str]:
        if self.client is not None and len(self.client):
            rows = self.client[~self.client["is_warmup"]]
            frame = pd.DataFrame({
                "request_id": rows["request_id"], "plan_index": rows["plan_index"],
                "start_time": rows["send_time"], "end_time": rows["end_time"], "is_ok": rows["is_ok"],
                "status_code": rows["status_code"], "error": rows["error"], "finish_reason": rows["finish_reason"],
                "num_prompt_tokens": rows["num_prompt_tokens"], "num_output_tokens": rows["num_output_tokens"],
                "ttft_s": rows["ttft_s"], "tpot_s": rows["tpot_s"], "e2e_s": rows["e2e_s"], "itl_s": rows["itl_s"],
                **{name: rows[name] for name in CLIENT_ONLY_COLUMNS if name in rows},
            })
            return frame.reset_index(drop=True), "client"
        requests = self.frame("requests")
        if len(requests):
            frame = pd.DataFrame({
                "request_id": requests["request_id"], "plan_index": pd.Series([None] * len(requests), dtype="Int64"),
                "start_time": requests["arrival_time"], "end_time": requests["finish_time"],
                "is_ok": requests["is_finished"], "status_code": np.where(requests["is_finished"], 200, 0),
                "error": None, "finish_reason": requests["finish_reason"],
                "num_prompt_tokens": requests["num_prompt_tokens"], "num_output_tokens": requests["num_output_tokens"],
                "ttft_s": requests["ttft_s"], "tpot_s": requests["tpot_s"], "e2e_s": requests["e2e_s"],
                "itl_s": requests["itl_s"],
            })
            return frame.sort_values("start_time").reset_index(drop=True), "server"
        return pd.DataFrame(columns=["request_id", "plan_index", "start_time", "end_time", "is_ok", "status_code",
                                     "error", "finish_reason", "num_prompt_tokens", "num_output_tokens", "ttft_s",
                                     "tpot_s", "e2e_s", "itl_s"]), "none"


CLIENT_ONLY_COLUMNS = ("num_retries", "server_prompt_s", "server_decode_s", "server_decode_tokens")


def load_points(path: str | os.PathLike[str]) -> list[RunDataset]:
    """The load points under ``path``: a sweep directory's points (``sweep.json``), else ``path`` itself."""
    path = Path(path)
    sweep = read_sweep(path)
    if sweep is None:
        return [RunDataset.load(path)]
    return [RunDataset.load(path / point.dir) for point in sweep.points]


def read_sweep(path: str | os.PathLike[str]) -> SweepIndex | None:
    """The sweep index of ``path``, or None when it is not a sweep directory."""
    try:
        return RunDirectory(path).sweep_index()
    except RunFileError as exc:
        raise DatasetError(str(exc)) from exc


def sweep_parameter(path: str | os.PathLike[str]) -> str | None:
    sweep = read_sweep(path)
    return None if sweep is None else sweep.parameter


def _read_client_rows(path: Path) -> pd.DataFrame:
    try:
        return pq.read_table(path, schema=CLIENT_REQUESTS).to_pandas()
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise DatasetError(f"{path} is not a readable client table: {exc}") from exc


def _read_client_health(path: Path) -> pd.DataFrame | None:
    """The load workers' health samples; None for a run without them (older, or no worker started)."""
    if not path.is_file():
        return None
    try:
        return pq.read_table(path, schema=CLIENT_HEALTH).to_pandas()
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path} is not a readable client health table: {exc}") from exc


def _read_prompts(path: Path) -> dict[int, str]:
    """``plan index -> prompt text`` from ``workload.jsonl`` (what each client row's ``plan_index`` refers to)."""
    if not path.is_file():
        return {}
    prompts: dict[int, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                item = json.loads(line)
                prompts[int(item["index"])] = str(item["prompt"])
    return prompts
