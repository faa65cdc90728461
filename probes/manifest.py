"""``run.json``: what was run, on what, with which code, and how each probe fared."""

from __future__ import annotations

import enum
import subprocess
import time
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from probes.base import ProbeStatus
from probes.machine import MachineInfo, software_versions
from probes.model_shape import ModelShape

FORMAT_VERSION = 1
# NOTE: the checkout this package was imported from (probes/ sits at the repository root).
_SOURCE_ROOT = Path(__file__).resolve().parents[1]


class RunStatus(enum.Enum):
    RUNNING = "running"  # still going, or it crashed: the files hold what was flushed
    COMPLETE = "complete"
    FAILED = "failed"  # stopped by an exception; ``error`` says which


class ManifestError(ValueError):
    """``run.json`` is missing a field or holds a wrong one."""


@dataclass(slots=True)
class RunManifest:
    """The manifest of one run directory; saved as ``run.json`` by the session and read by the loader."""

    servescope_version: str | None
    git_commit: str | None
    git_dirty: bool | None
    model: str | None
    engine_config: dict[str, Any] | None  # the finalized EngineConfig, as dataclasses.asdict gives it
    workload: dict[str, Any] | None
    seeds: dict[str, int]
    machine: MachineInfo
    software: dict[str, str | None]
    timers: dict[str, str]  # probe name -> the clock its durations come from
    started_at: float = field(default_factory=time.time)
    stopped_at: float | None = None
    status: RunStatus = RunStatus.RUNNING
    error: str | None = None
    probes: dict[str, ProbeStatus] = field(default_factory=dict)
    model_shape: ModelShape | None = None  # what the roofline needs; None when the model is unknown here
    # What makes the run's client-side figures suspect (reports.summary.RunWarning, as dicts): marked
    # when the run is summarized, after its probes stopped.
    warnings: list[dict[str, Any]] = field(default_factory=list)
    format_version: int = FORMAT_VERSION

    @classmethod
    def collect(cls, *, model: str | None = None, engine_config: dict[str, Any] | None = None,
                workload: dict[str, Any] | None = None, seeds: dict[str, int] | None = None,
                timers: dict[str, str] | None = None, model_shape: ModelShape | None = None) -> RunManifest:
        """A manifest for a run starting now, with this machine's and this checkout's details filled in."""
        commit, dirty = git_state(_SOURCE_ROOT)
        return cls(servescope_version=servescope_version(), git_commit=commit, git_dirty=dirty, model=model,
                   engine_config=engine_config, workload=workload, seeds=dict(seeds or {}),
                   machine=MachineInfo.collect(), software=software_versions(), timers=dict(timers or {}),
                   model_shape=model_shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version, "servescope_version": self.servescope_version,
            "git_commit": self.git_commit, "git_dirty": self.git_dirty, "model": self.model,
            "engine_config": self.engine_config, "workload": self.workload, "seeds": self.seeds,
            "machine": self.machine.to_dict(), "software": self.software, "timers": self.timers,
            "started_at": self.started_at, "stopped_at": self.stopped_at, "status": self.status.value,
            "error": self.error, "probes": {name: p.to_dict() for name, p in self.probes.items()},
            "model_shape": self.model_shape.to_dict() if self.model_shape is not None else None,
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, data: Any) -> RunManifest:
        if not isinstance(data, dict):
            raise ManifestError(f"the manifest must be a JSON object, got {type(data).__name__}")
        missing = sorted(set(_REQUIRED_KEYS) - set(data))
        if missing:
            raise ManifestError(f"the manifest lacks {missing}")
        if data["format_version"] != FORMAT_VERSION:
            raise ManifestError(f"format_version {data['format_version']!r} is not {FORMAT_VERSION}, "
                                "the one this servescope reads")
        try:
            return cls(
                servescope_version=data["servescope_version"], git_commit=data["git_commit"],
                git_dirty=data["git_dirty"], model=data["model"], engine_config=data["engine_config"],
                workload=data["workload"], seeds=dict(data["seeds"]), machine=MachineInfo.from_dict(data["machine"]),
                software=dict(data["software"]), timers=dict(data["timers"]), started_at=float(data["started_at"]),
                stopped_at=None if data["stopped_at"] is None else float(data["stopped_at"]),
                status=RunStatus(data["status"]), error=data["error"],
                probes={name: ProbeStatus.from_dict(p) for name, p in data["probes"].items()},
                model_shape=ModelShape.from_dict(data["model_shape"]) if data.get("model_shape") else None,
                warnings=[dict(w) for w in data.get("warnings", [])], format_version=data["format_version"],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"a malformed field: {type(exc).__name__}: {exc}") from exc


_REQUIRED_KEYS = ("format_version", "servescope_version", "git_commit", "git_dirty", "model", "engine_config",
                  "workload", "seeds", "machine", "software", "timers", "started_at", "stopped_at", "status",
                  "error", "probes")


def servescope_version() -> str | None:
    """The installed distribution's version, else the version in this checkout's pyproject.toml."""
    try:
        return metadata.version("servescope")
    except metadata.PackageNotFoundError:
        pass
    pyproject = _SOURCE_ROOT / "pyproject.toml"
    if not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    return project.get("version") if project.get("name") == "servescope" else None


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """``(HEAD commit, has uncommitted changes)`` of the checkout at ``root``; ``(None, None)`` outside one."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    # NOTE: an installed copy in a virtualenv that sits inside some other repository must not
    # report that repository's commit: the top level has to be this package's own root.
    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root:
        return None, None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)
