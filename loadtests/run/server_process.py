"""Our server, probed, as a child process on a free loopback port: start, wait for /health, stop.

The child is :mod:`loadtests.run.probed_server`; it binds port 0 itself and writes the port to a file,
so there is no window in which another process can take the port between choosing and binding.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

from loadtests.errors import ServerFailedError
from loadtests.run.processes import spawn, stop_group
from probes.run_dir import PORT_FILE_NAME, SERVER_LOG_NAME

HEALTH_POLL_S = 0.25


class ServerProcess:
    """``python -m loadtests.run.probed_server`` writing the run into ``run_dir``; a context manager.

    With ``probed=False`` it is plain ``servescope serve`` (no probes, no peaks): ``run_dir`` then
    only holds its log.
    """

    def __init__(self, run_dir: Path, serve_argv: list[str], host: str = "127.0.0.1", probed: bool = True) -> None:
        self.run_dir = run_dir
        self.serve_argv = list(serve_argv)  # serve's flags and probed_server's own, bar --run-dir/--port
        self.host = host
        self.probed = probed
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server has not reported its port yet")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / SERVER_LOG_NAME

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError("the server was already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        port_file = self.run_dir / PORT_FILE_NAME
        port_file.unlink(missing_ok=True)
        server = ["loadtests.run.probed_server", "--run-dir", str(self.run_dir)] if self.probed else ["loadtests.cli", "serve"]
        argv = [sys.executable, "-m", *server, "--host", self.host, "--port", "0", "--port-file", str(port_file),
                "--log-level", "warning", *self.serve_argv]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._process = spawn(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_healthy(self, timeout_s: float, on_wait: Callable[[float], None] | None = None) -> None:
        """Block until ``/health`` answers 200; ``on_wait(elapsed)`` is called between polls."""
        assert self._process is not None, "start() first"
        started = time.monotonic()
        port_file = self.run_dir / PORT_FILE_NAME
        while True:
            elapsed = time.monotonic() - started
            if self._process.poll() is not None:
                raise ServerFailedError(f"the server exited with status {self._process.returncode} before it was "
                                        f"healthy; its log ({self.log_path}) ends:\n{self.log_tail()}")
            if elapsed > timeout_s:
                raise ServerFailedError(f"the server was not healthy after {timeout_s:.0f} s; its log ends:\n"
                                        f"{self.log_tail()}")
            if self.port is None and port_file.is_file():
                self.port = int(json.loads(port_file.read_text())["port"])
            if self.port is not None and _is_healthy(self.url):
                port_file.unlink(missing_ok=True)
                return
            if on_wait is not None:
                on_wait(elapsed)
            time.sleep(HEALTH_POLL_S)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (graceful: the probes write their files), SIGKILL after ``timeout_s``; the exit status."""
        process = self._process
        if process is None:
            return None
        try:
            return stop_group(process, timeout_s)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def log_tail(self, num_lines: int = 20) -> str:
        if not self.log_path.is_file():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _is_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as response:  # noqa: S310 - our own loopback URL
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False

