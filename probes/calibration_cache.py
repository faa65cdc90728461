"""The step calibration, kept per machine, model, engine code and settings, so a second run pays nothing.

The key holds everything the calibration's figures depend on: this machine (CPU model, cores, GPU,
torch), the model (its name and the weights file's size and mtime), the engine's own
source files and the calibration's (a kernel rewritten is re-measured) and the settings the
calibration ran with (the run's kept engine settings, its path, the context, the batch sizes, the
variants). A run with the same key reads the file instead of measuring.

``$SERVESCOPE_CALIBRATION_CACHE`` names the directory (default ``~/.cache/servescope/calibration``, or
under ``$SERVESCOPE_CACHE``); ``off`` measures every time.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CACHE_ENV = "SERVESCOPE_CALIBRATION_CACHE"
OFF = "off"
_ROOT = Path(__file__).resolve().parents[1]
# The code whose change changes what the calibration measures.
_CODE = ("engine", "probes/step_calibration.py", "probes/accuracy.py", "probes/execution_variants.py")


def cache_dir() -> Path | None:
    """Where calibrations are kept; None when ``$SERVESCOPE_CALIBRATION_CACHE`` is ``off``."""
    env = os.environ.get(CACHE_ENV)
    if env == OFF:
        return None
    if env:
        return Path(env).expanduser()
    from engine.weights.fetch import default_cache_dir

    return default_cache_dir() / "calibration"


def code_digest() -> str:
    """A digest of the engine's and the calibration's source files (``.py`` and ``.c``)."""
    digest = hashlib.sha256()
    for name in _CODE:
        path = _ROOT / name
        files = sorted(p for p in path.rglob("*") if p.suffix in (".py", ".c")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(_ROOT)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def machine_identity() -> dict[str, Any]:
    import psutil
    import torch

    from probes.machine import cpu_model

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    # NOTE: not torch's current thread count, which building an engine sets; the settings hold num_threads
    return {"cpu": cpu_model(), "cores": psutil.cpu_count(), "gpu": gpu, "torch": torch.__version__}


def model_identity(model: str, source: str) -> dict[str, Any]:
    path = Path(source)
    if path.is_file():
        stat = path.stat()
        return {"model": model, "source": str(path), "bytes": stat.st_size, "mtime": int(stat.st_mtime)}
    return {"model": model, "source": source}


def cache_key(model: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    """The key of a calibration of ``model`` (:func:`model_identity`) under ``settings``, on this machine and code."""
    document = {"machine": machine_identity(), "model": dict(model), "code": code_digest(), "settings": dict(settings)}
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()[:24]


def read_cached(key: str) -> dict[str, Any] | None:
    """The calibration kept under ``key``, as saved; None when there is none (or the cache is off or unreadable)."""
    root = cache_dir()
    path = root / f"{key}.json" if root is not None else None
    if path is None or not path.is_file():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def write_cached(key: str, data: Mapping[str, Any]) -> Path | None:
    """Keep ``data`` under ``key`` (written whole or not at all); None when the cache is off or not writable."""
    root = cache_dir()
    if root is None:
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{key}.json"
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(dict(data), sort_keys=True))
        temporary.replace(path)
        return path
    except OSError:
        return None
