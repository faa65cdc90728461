"""Shared fixtures: the servescope command, and a real probed dummy:tiny server on a free loopback port."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.run.server_process import ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "dummy:tiny"
# Small, fast requests (the tests check counts and orderings, never speed); a short stop timeout
# bounds a run that fails to end itself.
FAST_LOAD = ["--workload", "fixed", "--max-tokens", "8", "--stop-timeout", "15"]


@functools.cache
def servescope_command() -> list[str]:
    """``servescope`` as installed when it has the load commands, else the same commands from the checkout.

    NOTE: cached: asking the installed script for its ``--help`` starts a process that imports the whole CLI.
    """
    script = Path(sys.executable).parent / "servescope"
    if script.exists():
        listed = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
        if "diagnose" in listed.stdout:
            return [str(script)]
    return [sys.executable, "-m", "loadtests.cli"]


def cli_env() -> dict[str, str]:
    """The environment for ``servescope_command()``.

    NOTE: the checkout goes on PYTHONPATH by absolute path, so the fallback works from any cwd.
    """
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def run_cli(*args: str, timeout_s: float = 120.0, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*servescope_command(), *args], capture_output=True, text=True, timeout=timeout_s,
                          cwd=cwd, env=cli_env())


@pytest.fixture(scope="session")
def dummy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``servescope serve --model dummy:tiny`` with probes, for tests that load an already-running server.

    NOTE: one server for the whole session: every test that uses it reads only its own load's rows, files and
    counter growth, never the server's totals, so earlier loads do not change what a test sees.
    """
    server = ServerProcess(tmp_path_factory.mktemp("server"), ["--model", MODEL, "--execution", "eager"])
    server.start()
    try:
        server.wait_healthy(120.0)
        yield server
    finally:
        server.stop()


@pytest.fixture
def without_execution_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process ``servescope load`` runs that skip the execution reference after the load (a second
    ``servescope serve`` start and its timed decode steps: seconds per run).

    NOTE: only for tests that read nothing of it. test_load's sweep test checks the reference against the same
    server, and a failing reference never fails a run (it is noted and the run stands), so a test that does not
    read execution_reference.json checks nothing of it by running it.
    """
    from loadtests.run import orchestrator

    monkeypatch.setattr(orchestrator, "time_reference", lambda *args, **kwargs: None)
