"""Load from many machines: ``servescope load --master`` and ``servescope worker``, as separate commands.

The processes run on 127.0.0.1 against a real ``servescope serve --model dummy:tiny``; the workers
run in a directory of their own, as on another machine, and get everything from the master.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loadtests.cli import main
from loadtests.client.records import journal_path, journal_paths
from loadtests.client.relay import DONE_MESSAGE, HEALTH, REQUESTS, ROWS_MESSAGE, RowRelay
from loadtests.client.table import load_client_requests
from loadtests.run.locust_runner import read_locust_stats
from loadtests.run.server_process import ServerProcess
from probes.loader import load_manifest
from probes.run_dir import LOST_MISSED_HEARTBEATS, WORKERS_NAME, RunDirectory
from tests.loadtests.conftest import FAST_LOAD, cli_env, servescope_command
from tests.loadtests.test_diagnose import VERDICTS, check_token_rows
from tests.loadtests.test_plain_locust import free_port

# Bounds on waits (never on how fast anything is): a whole run, the workers' first rows.
RUN_TIMEOUT_S = 180.0
FIRST_ROWS_TIMEOUT_S = 90.0


@contextmanager
def started(argv: list[str], cwd: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A servescope command running in ``cwd``, its output in ``log``; killed if the test leaves it running."""
    with open(log, "wb") as out:
        process = subprocess.Popen([*servescope_command(), *argv], cwd=cwd, env=cli_env(), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def master_argv(target: str, port: int, out: Path, *load: str) -> list[str]:
    return ["load", "--target", target, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port",
            str(port), "--expect-workers", "2", "--worker-wait", "120", *FAST_LOAD, *load, "--out", str(out)]


def finished(process: subprocess.Popen[bytes], log: Path) -> int:
    try:
        return process.wait(RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{process.args} still running after {RUN_TIMEOUT_S:.0f} s; its log ends: "
                    f"{log.read_text(errors='replace')[-3000:]}")


@pytest.mark.usefixtures("without_execution_reference")
def test_a_master_and_two_workers_started_apart_bring_every_row_home(tmp_path: Path, dummy_server: ServerProcess,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out, port = tmp_path / "run", free_port()
    elsewhere = tmp_path / "worker-machine"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    # NOTE: the workers are `servescope worker` commands of their own, started first (they wait for their master);
    # the master is the same `servescope load --master` run in this process, which skips the execution reference
    # (a second server start that this test does not read; test_load's sweep test checks it).
    join = ["worker", "--master-host", "127.0.0.1", "--master-port", str(port)]
    with started(join, elsewhere, tmp_path / "w-a.log") as worker_a, \
         started(join, elsewhere, tmp_path / "w-b.log") as worker_b:
        assert main(master_argv(dummy_server.url, port, out, "--users", "4", "--duration", "2", "--warmup", "1")) == 0
        assert finished(worker_a, tmp_path / "w-a.log") == 0 and finished(worker_b, tmp_path / "w-b.log") == 0
    assert list(elsewhere.iterdir()) == []  # the workers needed nothing on their own disk, and left nothing

    rows = load_client_requests(out)
    stats = read_locust_stats(out)
    # Locust's count (merged from the workers' stats) is the run directory's, request for request.
    assert int(stats.loc[stats["Type"] == "POST", "Request Count"].sum()) == len(rows) > 0
    assert rows["is_ok"].all() and rows["request_id"].is_unique
    check_token_rows(out, rows)
    # Both workers' rows came home, none missing, each from its own share of the master's plan.
    num_planned = len((out / "workload.jsonl").read_text().splitlines())
    assert set(rows["worker"]) == {"w0", "w1"}
    for index, worker in enumerate(("w0", "w1")):
        mine = rows[rows["worker"] == worker].sort_values("seq")
        assert len(mine) > 0 and list(mine["seq"]) == list(range(len(mine)))
        assert list(mine["plan_index"]) == [(index + 2 * seq) % num_planned for seq in mine["seq"]]
    assert journal_paths(out) == [] and not (out / WORKERS_NAME).exists()  # merged, and folded into load.json
    load = json.loads((out / "load.json").read_text())
    assert load["config"]["processes"] == 2 and load["config"]["master"]["bind_port"] == port
    workers = {w["worker"]: w for w in load["workers"]}
    assert set(workers) == {"w0", "w1"} and all(w["is_done"] and w["lost"] is None for w in workers.values())
    assert {name: w["num_rows"] for name, w in workers.items()} == rows.groupby("worker").size().to_dict()
    # The summary, diagnosis and report, as for a local run; each worker sampled its own health.
    point = json.loads((out / "summary.json").read_text())["points"][0]
    assert point["accounting"]["is_consistent"], point["accounting"]
    assert point["client"]["num_requests"] == int((~rows["is_warmup"]).sum())
    assert sorted(w["worker"] for w in point["workers"]) == ["w0", "w1"]
    assert not [w for w in point["warnings"] if w["kind"] == "lost_worker"]
    assert json.loads((out / "diagnosis.json").read_text())["bottleneck"] in VERDICTS
    html = (out / "report.html").read_text()
    assert "as their master saw them" in html and "lost: it" not in html


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_counted_lost_and_its_rows_kept(tmp_path: Path,
                                                                  dummy_server: ServerProcess) -> None:
    out, port = tmp_path / "run", free_port()
    join = ["worker", "--master-host", "127.0.0.1", "--master-port", str(port)]
    with started(master_argv(dummy_server.url, port, out, "--users", "4", "--duration", "10", "--warmup", "0"),
                 tmp_path, tmp_path / "master.log") as master, \
         started(join, tmp_path, tmp_path / "w-a.log") as doomed, \
         started(join, tmp_path, tmp_path / "w-b.log") as survivor:
        # Once both workers' rows are arriving, one dies without a word (no quit, no last batch).
        deadline = time.monotonic() + FIRST_ROWS_TIMEOUT_S
        while not all(_has_rows(journal_path(out, w)) for w in ("w0", "w1")):
            assert time.monotonic() < deadline, (tmp_path / "master.log").read_text()[-3000:]
            time.sleep(0.2)
        os.kill(doomed.pid, signal.SIGKILL)  # NOTE: `servescope worker` is the Locust worker (exec)
        assert finished(master, tmp_path / "master.log") == 0, (tmp_path / "master.log").read_text()[-3000:]
        assert finished(survivor, tmp_path / "w-b.log") == 0

    rows = load_client_requests(out)
    load = json.loads((out / "load.json").read_text())
    (lost,) = [w for w in load["workers"] if w["lost"] is not None]
    (kept,) = [w for w in load["workers"] if w["lost"] is None]
    assert lost["lost"] == LOST_MISSED_HEARTBEATS and not lost["is_done"] and kept["is_done"]
    by_worker = rows.groupby("worker").size().to_dict()
    # What the lost worker sent before it died is in the run; the count says how many.
    assert lost["num_rows"] == by_worker[lost["worker"]] > 0 and kept["num_rows"] == by_worker[kept["worker"]]
    # The survivor ran to the end: it sent past the moment its peer's last row was sent.
    assert rows.loc[rows["worker"] == kept["worker"], "send_time"].max() > \
        rows.loc[rows["worker"] == lost["worker"], "send_time"].max()
    point = json.loads((out / "summary.json").read_text())["points"][0]
    (warning,) = [w for w in point["warnings"] if w["kind"] == "lost_worker"]
    assert f"load worker {lost['worker']}" in warning["message"]
    assert f"{lost['num_rows']} of its requests were recorded" in warning["message"]
    assert warning in load_manifest(RunDirectory(out)).warnings  # run.json says so too
    assert f"{lost['num_rows']} of its requests were recorded" in (out / "report.html").read_text()
    assert json.loads((out / "diagnosis.json").read_text())["bottleneck"] in VERDICTS


def _has_rows(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def test_a_master_whose_workers_never_come_says_how_many_came(tmp_path: Path, dummy_server: ServerProcess,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert main(["load", "--target", dummy_server.url, "--master", "--master-bind-host", "127.0.0.1",
                 "--master-bind-port", str(port), "--expect-workers", "2", "--worker-wait", "1", "--users", "2",
                 "--duration", "1", *FAST_LOAD, "--out", str(tmp_path / "run")]) == 1
    err = " ".join(capsys.readouterr().err.split())  # NOTE: the console wraps long lines
    assert f"waited 1 s on 127.0.0.1:{port} for 2 workers; 0 came" in err
    assert f"servescope worker --master-host <this host> --master-port {port}" in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--master"], "--master needs --expect-workers N"),
    (["--expect-workers", "2"], "--expect-workers needs --master"),
    (["--master", "--expect-workers", "2", "--processes", "2"], "drop --processes"),
    (["--master", "--expect-workers", "4", "--users", "2"], "at least as many users as workers"),
    (["--master", "--expect-workers", "2", "--master-bind-port", "70000"], "bind port must be in 1..65535"),
    (["--master", "--expect-workers", "2", "--sweep", "users=2,4"], "drop --sweep"),
])
def test_master_flags_are_checked_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         flags: list[str], message: str) -> None:
    assert main(["load", "--target", "http://127.0.0.1:9", *flags, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_worker_with_an_unknown_master_host_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--master-host", "no-such-host.invalid"]) == 2
    assert "--master-host 'no-such-host.invalid' does not resolve" in capsys.readouterr().err


class Sent:
    """What a relay handed to its runner's ``send_message``, in order."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict]] = []
        self.is_down = False

    def __call__(self, kind: str, data: dict) -> None:
        if self.is_down:
            raise ConnectionError("master unreachable")
        self.messages.append((kind, json.loads(json.dumps(data))))

    def lines(self, kind: str) -> list[str]:
        return [line for k, data in self.messages if k == ROWS_MESSAGE for line in data["lines"][kind]]


def test_the_relay_batches_by_count_and_by_time_and_loses_nothing_on_close() -> None:
    import gevent

    sent = Sent()
    relay = RowRelay(sent, "w3", interval_s=0.05, max_lines=4)
    relay.count_started = lambda: 9
    requests, health = relay.lines(REQUESTS), relay.lines(HEALTH)
    for i in range(6):
        requests.write_line(f"r{i}")
    assert [len(data["lines"][REQUESTS]) for _, data in sent.messages] == [4]  # a full batch went at once
    health.write_line("h0")
    relay.start()
    gevent.sleep(0.2)  # the timer sends the rest
    assert sent.lines(REQUESTS) == [f"r{i}" for i in range(6)] and sent.lines(HEALTH) == ["h0"]
    sent.is_down = True
    requests.write_line("r6")
    gevent.sleep(0.2)  # a failed send keeps its lines for the next try
    sent.is_down = False
    requests.write_line("r7")
    relay.close()
    relay.done(ended_itself=True)
    assert sent.lines(REQUESTS) == [f"r{i}" for i in range(8)]
    kind, done = sent.messages[-1]
    assert kind == DONE_MESSAGE and done == {"worker": "w3", "num_rows": 8, "num_started": 9, "ended_itself": True}
    assert all(data["worker"] == "w3" and data["num_started"] == 9 for _, data in sent.messages)
    messages_after_close = len(sent.messages)
    gevent.sleep(0.2)
    assert len(sent.messages) == messages_after_close  # closed: the timer is gone

