"""``servescope serve`` as a child process (``python -m loadtests.cli serve``), as users and other tools run it."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time

from tests.server.conftest import MODEL

STARTUP_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 30.0


class ServeProcess:
    """``python -m loadtests.cli serve`` on port 0, with its stderr read on a thread."""

    def __init__(self, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loadtests.cli", "serve", "--model", MODEL, "--port", "0", "--execution", "eager",
             "--num-kv-blocks", "128", "--shutdown-timeout", "20", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for_url()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.log.append(line)
            match = re.search(r"running on (http://127\.0\.0\.1:\d+)", line)
            if match:
                return match.group(1)
        self.proc.kill()
        raise RuntimeError("servescope serve did not start:\n" + "".join(self.log))

    def exit_code(self) -> int:
        code = self.proc.wait(timeout=EXIT_TIMEOUT_S)
        while not self.lines.empty():
            self.log.append(self.lines.get())
        return code

    def stop(self) -> None:
        """Kill the server if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=EXIT_TIMEOUT_S)
