"""Child processes the orchestrator owns: each in its own process group, so stopping one stops all it started.

Locust with ``--processes`` forks workers; the probed server may fork too. Signalling the group, not
just the pid, leaves nothing behind, and a terminal's Ctrl-C reaches only servescope, which then
stops its children in order (Locust first, then the server, so the server's probes get written).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def spawn(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` in a new session (its own process group, led by the child)."""
    return subprocess.Popen(argv, start_new_session=True, **popen_kwargs)


def signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to the child's whole group; no-op once nothing in it is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child and everything in its group, and reap the child."""
    signal_group(process, signal.SIGKILL)
    process.wait()


def stop_group(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    """SIGTERM the group, SIGKILL what is left after ``timeout_s``; the child's exit status."""
    if process.poll() is None:
        signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout_s)
    # NOTE: also after a clean exit: grandchildren the child left behind share its group.
    kill_group(process)
    return process.returncode
