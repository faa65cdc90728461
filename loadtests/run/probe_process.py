"""The host and ``/metrics`` probes of a plain Locust run, in a process of their own.

Locust's process runs on one gevent loop: a probe writing Parquet parts and fsyncing ``run.json``
there would hold up every user's stream, and show as token gaps that never happened. So
:class:`ProbeProcess` starts this module as a child (``python -m loadtests.run.probe_process``): it
imports the probes (and prints ``imported``), reads its run from stdin (one JSON line: the run directory, the target, the
load config and the Locust process's pid), probes this host and that process and scrapes the
target's ``/metrics``, prints ``ready`` once ``run.json`` exists, and stops the probes, writing
their tables, when its stdin closes: when the run stops, or when Locust dies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from loadtests.config import LoadConfig

if TYPE_CHECKING:
    from loadtests.run.orchestrator import Target

IMPORTED, READY = "imported", "ready"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Seconds the child may take to import and start its probes, and to write their tables at the end.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


class ProbeProcess:
    """The child that probes one plain run; spawned ahead (:meth:`spawn`), so its imports happen
    before the test starts, then :meth:`start`-ed with the run, and :meth:`stop`-ped to write its tables."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.is_imported = False

    @classmethod
    def spawn(cls) -> ProbeProcess:
        """Start the child; it imports the probes, then waits for its run on stdin."""
        # NOTE: the checkout on the child's path, as Locust put it on this process's to load the locustfile.
        pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        process = subprocess.Popen([sys.executable, "-m", "loadtests.run.probe_process"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": pythonpath})
        return cls(process)

    def wait_imported(self) -> None:
        """Wait until the child has imported the probes (it is then ready for a run within a second)."""
        if not self.is_imported:
            self._expect(IMPORTED)
            self.is_imported = True

    def start(self, run_dir: Path, target: Target, config: LoadConfig) -> None:
        """Give the child its run and wait until its probes run (``run.json`` written)."""
        self.wait_imported()
        assert self.process.stdin is not None
        run = {"run_dir": str(run_dir), "target": dataclasses.asdict(target), "config": config.to_dict(),
               "pid": os.getpid()}
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.write(json.dumps(run) + "\n")
            self.process.stdin.flush()
        self._expect(READY)

    def _expect(self, word: str) -> None:
        import gevent

        assert self.process.stdout is not None
        line = ""
        with gevent.Timeout(START_TIMEOUT_S, False):
            line = self.process.stdout.readline()
        if line.strip() != word:
            self.process.kill()
            raise RuntimeError(f"the probe process did not start (exit status {self.process.wait()}); see its "
                               f"error above")

    def stop(self) -> int:
        """Close the child's stdin and wait for it to write the probes' tables; its exit status."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def main() -> int:
    """The child: import, read the run (one JSON line), probe it until stdin closes."""
    # NOTE: a terminal's Ctrl-C stops Locust, which then closes our stdin; it must not stop us first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from loadtests.run.orchestrator import start_external_probes
    from loadtests.run.target import Target

    print(IMPORTED, flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # no run came: Locust quit first
    run = json.loads(line)
    fields = {f.name for f in dataclasses.fields(LoadConfig)}
    config = LoadConfig(**{k: v for k, v in run["config"].items() if k in fields})
    session = start_external_probes(Path(run["run_dir"]), Target(**run["target"]), config, pid=int(run["pid"]))
    print(READY, flush=True)
    error: BaseException | None = None
    try:
        sys.stdin.read()  # NOTE: returns at EOF: the parent closed the pipe, or died
    except BaseException as exc:
        error = exc
        raise
    finally:
        session.stop(error=error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
