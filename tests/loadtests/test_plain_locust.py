"""``locust -f loadtests/locustfile.py`` as Locust's docs teach it, with no ``--ss-*`` flag: headless and web UI.

Both run real Locust as a child process against a real ``servescope serve --model dummy:tiny``.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from loadtests.cli import main
from loadtests.client.load_context import ITL_ROW, LLM_REQUEST_TYPE, OUTPUT_TOKENS_ROW, TPOT_ROW, TTFT_ROW
from loadtests.client.table import load_client_requests
from loadtests.client.web_ui import TAB_KEY
from loadtests.config import LOCUSTFILE
from loadtests.run.server_process import ServerProcess
from tests.loadtests.conftest import cli_env

VERDICTS = {"batching", "cache", "execution", "none"}
LLM_ROWS = {TTFT_ROW, TPOT_ROW, ITL_ROW, OUTPUT_TOKENS_ROW}
# Bounds on waits (never on how fast anything is): Locust's start, a run's requests, its report.
START_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 120.0


def locust_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args]


def only_run_dir(cwd: Path) -> Path:
    run_dirs = sorted((cwd / "runs").glob("locust-*"))
    assert len(run_dirs) == 1, run_dirs
    return run_dirs[0]


def test_headless_plain_locust_writes_a_run_that_servescope_reports(tmp_path: Path,
                                                                     dummy_server: ServerProcess) -> None:
    csv_prefix = tmp_path / "stats"
    done = subprocess.run(locust_argv("--headless", "-u", "3", "-r", "3", "-t", "5s", "--host", dummy_server.url,
                                      "--csv", str(csv_prefix)),
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"LLMUser": 3' in done.stderr and "OpenLoopUser" not in done.stderr  # Locust's spawn log
    stats = pd.read_csv(f"{csv_prefix}_stats.csv")
    counts = {(row["Type"], row["Name"]): (row["Request Count"], row["Failure Count"])
              for row in stats.to_dict("records")}
    num_http, num_failed = counts[("POST", "/v1/completions")]
    assert num_http > 0 and num_failed == 0
    # Each successful request reports one TTFT and one TPOT row entry beside its HTTP row.
    assert counts[(LLM_REQUEST_TYPE, TTFT_ROW)] == (num_http, 0)
    assert counts[(LLM_REQUEST_TYPE, TPOT_ROW)] == (num_http, 0)
    assert counts[(LLM_REQUEST_TYPE, ITL_ROW)][0] > 0 and counts[(LLM_REQUEST_TYPE, OUTPUT_TOKENS_ROW)][0] > 0

    run_dir = only_run_dir(tmp_path)
    load = json.loads((run_dir / "load.json").read_text())
    assert load["model"] == "dummy:tiny" and load["tokenizer"] == "dummy:tiny"  # from the target's /v1/models
    assert load["config"]["mode"] == "closed" and load["config"]["users"] == 3  # LLMUser alone, Locust's -u
    rows = load_client_requests(run_dir)
    assert len(rows) == num_http and rows["is_ok"].all()  # the run directory counts what Locust counted
    tokens = counts[(LLM_REQUEST_TYPE, OUTPUT_TOKENS_ROW)][0]
    assert tokens == rows["num_output_tokens"].sum()

    (run_dir / "diagnosis.json").unlink()
    assert main(["report", str(run_dir)]) == 0  # NOTE: the command's main in this process (a process start saved)
    diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    assert diagnosis["bottleneck"] in VERDICTS, diagnosis.get("no_verdict")
    assert (run_dir / "report.html").is_file()


@pytest.mark.slow
def test_plain_master_worker_run_counts_every_workers_requests(tmp_path: Path, dummy_server: ServerProcess) -> None:
    csv_prefix = tmp_path / "stats"
    done = subprocess.run(locust_argv("--headless", "-u", "4", "-r", "4", "-t", "10s", "--processes", "2",
                                      "--host", dummy_server.url, "--csv", str(csv_prefix)),
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    rows = load_client_requests(run_dir)
    assert set(rows["worker"]) == {"w0", "w1"} and rows["is_ok"].all()  # both workers sent, from one plan
    # NOTE: the master quits at -t before its workers stop; the run waits for them, so all counts agree.
    accounting = json.loads((run_dir / "summary.json").read_text())["points"][0]["accounting"]
    assert accounting["is_consistent"] and accounting["client_rows"] == len(rows), accounting
    # The master collected both workers' rows; neither was lost on the way out.
    workers = json.loads((run_dir / "load.json").read_text())["workers"]
    assert sorted(w["worker"] for w in workers) == ["w0", "w1"]
    assert all(w["is_done"] and w["lost"] is None for w in workers), workers
    assert sum(w["num_rows"] for w in workers) == len(rows)
    stats = pd.read_csv(f"{csv_prefix}_stats.csv")
    assert int(stats.loc[stats["Type"] == "POST", "Request Count"].sum()) == len(rows)


@pytest.mark.slow
def test_ss_rate_alone_makes_a_plain_run_open_loop(tmp_path: Path, dummy_server: ServerProcess) -> None:
    rate = 4.0
    done = subprocess.run(locust_argv("--headless", "-u", "1", "-r", "1", "-t", "8s", "--host", dummy_server.url,
                                      "--ss-rate", f"{rate:g}"),
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"OpenLoopUser": 1' in done.stderr and "LLMUser" not in done.stderr
    run_dir = only_run_dir(tmp_path)
    config = json.loads((run_dir / "load.json").read_text())["config"]
    assert config["mode"] == "open" and config["rate"] == rate
    rows = load_client_requests(run_dir)
    assert len(rows) > 0 and rows["scheduled_time"].notna().all()  # sent on the arrival schedule
    assert json.loads((run_dir / "summary.json").read_text())["points"][0]["open_loop"]["offered_rate_per_s"] == rate


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def web(base: str, path: str, form: dict[str, Any] | None = None) -> dict[str, Any]:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    with urllib.request.urlopen(urllib.request.Request(base + path, data=data), timeout=10.0) as response:  # noqa: S310
        return json.loads(response.read())


def wait_for(condition: Any, timeout_s: float, what: str, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"{what} within {timeout_s:.0f} s; Locust's log ends: {log.read_text()[-3000:]}")


def llm_rows(stats: dict[str, Any]) -> dict[str, int]:
    return {row["name"]: row["num_requests"] for row in stats["stats"] if row["method"] == LLM_REQUEST_TYPE}


def llm_tab(stats: dict) -> dict:
    """The LLM tab's rows in one ``/stats/requests`` answer, by metric."""
    return {row["metric"]: row for extended in stats.get("extended_stats", []) if extended["key"] == TAB_KEY
            for row in extended["data"]}


@pytest.mark.slow
def test_web_ui_lists_the_llm_rows_and_user_changes_reach_the_report(tmp_path: Path,
                                                                      dummy_server: ServerProcess) -> None:
    port, log = free_port(), tmp_path / "locust.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as sink:
        process = subprocess.Popen(locust_argv("--host", dummy_server.url, "--web-host", "127.0.0.1",
                                               "--web-port", str(port)),
                                   cwd=tmp_path, env=cli_env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        def is_up() -> bool:
            try:
                return "stats" in web(base, "/stats/requests")
            except OSError:
                assert process.poll() is None, log.read_text()[-3000:]
                return False

        wait_for(is_up, START_TIMEOUT_S, "the web UI never answered", log)
        assert web(base, "/swarm", {"user_count": 1, "spawn_rate": 5})["success"]
        wait_for(lambda: llm_rows(web(base, "/stats/requests")).get(TTFT_ROW), RUN_TIMEOUT_S,
                 "no TTFT row", log)
        # More users from the UI mid-run; the run then stops itself after run_time.
        assert web(base, "/swarm", {"user_count": 3, "spawn_rate": 5, "run_time": "4s"})["success"]
        # NOTE: the tab's "now" is Locust's rate over its last few seconds, empty for a moment on a
        # loaded machine: the answer is taken once it shows output flowing at 3 users.
        stats = wait_for(lambda: (s := web(base, "/stats/requests"))["user_count"] == 3
                         and (llm_tab(s).get("output tokens/s", {}).get("now") or 0) > 0 and s, RUN_TIMEOUT_S,
                         "the user count never reached 3 with output flowing", log)
        rows = llm_rows(stats)
        assert set(rows) >= LLM_ROWS and all(rows[name] > 0 for name in LLM_ROWS), rows
        # The LLM tab: its rows ride on the same answer, counted from the same Locust entries.
        tab = llm_tab(stats)
        assert tab["TTFT (ms)"]["samples"] == rows[TTFT_ROW] and tab["TPOT (ms)"]["samples"] == rows[TPOT_ROW]
        assert tab["output tokens/s"]["samples"] == rows[OUTPUT_TOKENS_ROW] and tab["output tokens/s"]["now"] > 0
        with urllib.request.urlopen(base + "/", timeout=10.0) as page:  # noqa: S310
            assert TAB_KEY in page.read().decode()
        run_dir = wait_for(lambda: next((tmp_path / "runs").glob("locust-*/diagnosis.json"), None), RUN_TIMEOUT_S,
                           "the stopped run wrote no diagnosis", log).parent
        assert web(base, "/stats/requests")["state"] == "stopped"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    load = json.loads((run_dir / "load.json").read_text())
    steps = [step["users"] for step in load["users_timeline"]]
    assert 1 in steps and 3 in steps and steps.index(1) < steps.index(3)  # the UI's change, in order
    assert json.loads((run_dir / "diagnosis.json").read_text())["bottleneck"] in VERDICTS
    assert "Locust users" in (run_dir / "report.html").read_text()


def test_ss_help_lists_the_servescope_options_with_their_descriptions() -> None:
    done = subprocess.run(locust_argv("--ss-help"), env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # The group: its title, its description, then one entry per option (flag, metavar, description).
    options_text = done.stdout[done.stdout.index("\nservescope:"):].split("\n\n")[1]
    entries = {block.split()[0]: block for block in re.split(r"\n(?=  --ss-)", options_text)}
    for flag in ("--ss-run-dir", "--ss-model", "--ss-tokenizer", "--ss-workload", "--ss-max-tokens", "--ss-rate",
                 "--ss-duration", "--ss-warmup", "--ss-api"):
        assert flag in entries, sorted(entries)
    for flag, block in entries.items():
        description = re.sub(r"\{[^}]*\}", "", block.replace(flag, ""))  # less the flag and its choices
        assert re.search(r"[a-z]{3,}", description), f"{flag} has no description"
