"""The processes ``servescope diagnose`` starts (Locust, the probed server) never outlive it: not on
Ctrl-C, not on SIGTERM, not when Locust dies under it; and the server's run files are still written."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from probes.loader import load_run
from tests.loadtests.conftest import FAST_LOAD, MODEL, cli_env, servescope_command

START_TIMEOUT_S = 180.0


def start_diagnose(out: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [*servescope_command(), "diagnose", "--model", MODEL, "--duration", "120", "--warmup", "1",
            "--users", "2", *FAST_LOAD, "--out", str(out)]
    with open(log, "wb") as sink:
        return subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=cli_env())


def wait_for_children(process: subprocess.Popen[bytes], log: Path, out: Path
                      ) -> tuple[list[psutil.Process], psutil.Process]:
    """Every descendant once Locust has completed requests against the server; and the Locust master."""
    deadline = time.monotonic() + START_TIMEOUT_S
    parent = psutil.Process(process.pid)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"diagnose exited early ({process.returncode}): {log.read_text()[-2000:]}")
        children = parent.children(recursive=True)
        lines = {child: " ".join(_cmdline(child)) for child in children}
        locust = [c for c, line in lines.items() if "locust" in line and "locustfile" in line]
        served = any(journal.stat().st_size > 0 for journal in out.glob("client_requests-w*.jsonl"))
        if locust and served and any("loadtests.run.probed_server" in line for line in lines.values()):
            return parent.children(recursive=True), locust[0]
        time.sleep(0.2)
    pytest.fail(f"Locust and the server never both ran: {log.read_text()[-2000:]}")


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def assert_all_gone(children: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left running: {[(p.pid, _cmdline(p)) for p in alive]}"


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_to_diagnose_stops_locust_and_the_server(tmp_path: Path, sig: signal.Signals) -> None:
    out, log = tmp_path / "run", tmp_path / "diagnose.log"
    process = start_diagnose(out, log)
    try:
        children, _ = wait_for_children(process, log, out)
        process.send_signal(sig)
        returncode = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert returncode == (130 if sig == signal.SIGINT else 128 + signal.SIGTERM), log.read_text()[-2000:]
    assert_all_gone(children)
    # The server was stopped gracefully: its probes wrote a readable run directory.
    run = load_run(out)
    assert len(run.frame("steps")) > 0 and len(run.frame("requests")) > 0


@pytest.mark.slow
def test_locust_dying_mid_run_fails_the_run_and_stops_the_server(tmp_path: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "diagnose.log"
    process = start_diagnose(out, log)
    try:
        children, locust = wait_for_children(process, log, out)
        locust.kill()
        returncode = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert returncode == 1, log.read_text()[-2000:]
    assert "Locust exited with status" in log.read_text()
    assert_all_gone(children)
