"""``servescope diagnose``: our server, probed, loaded by real Locust; nothing lost between the three counts."""

from __future__ import annotations

import json
import re
from importlib.util import find_spec
from pathlib import Path

import pandas as pd
import pytest

from loadtests.cli import main
from loadtests.client.load_context import ITL_ROW, TPOT_ROW, TTFT_ROW, WARMUP_SUFFIX
from loadtests.client.records import journal_paths
from loadtests.client.table import load_client_requests
from loadtests.run.locust_runner import read_locust_stats
from probes.loader import load_run
from reports.console import SUMMARY_COLUMNS
from tests.loadtests.conftest import FAST_LOAD, MODEL, run_cli

# The contract's verdicts; "undetermined" only where this install has no report package to judge.
VERDICTS = ("batching", "cache", "execution", "none") if find_spec("reports.verdict.diagnosis") else ("undetermined",)
RUN_FILES = ("run.json", "steps.parquet", "requests.parquet", "host.parquet", "trace.json", "load.json",
             "workload.jsonl", "client_requests.parquet", "locust_stats.csv", "locust.html", "summary.json",
             "diagnosis.json", "report.html")


def locust_count(stats: pd.DataFrame, kind: str, name: str) -> int:
    rows = stats[(stats["Type"] == kind) & (stats["Name"] == name)]
    return int(rows["Request Count"].sum())


def check_nothing_lost(out: Path) -> pd.DataFrame:
    """Requests sent == Locust's HTTP rows == requests the server finished == client rows, id for id."""
    rows = load_client_requests(out)
    server = load_run(out).frame("requests")
    stats = read_locust_stats(out)
    assert len(rows) > 0 and rows["is_ok"].all(), rows.loc[~rows["is_ok"], "error"].tolist()
    assert int(stats.loc[stats["Type"] == "POST", "Request Count"].sum()) == len(rows)
    assert server["is_finished"].all() and len(server) == len(rows)
    assert set(server["request_id"]) == set(rows["request_id"])  # the same requests, not just as many
    assert rows["request_id"].is_unique
    assert journal_paths(out) == []  # merged into client_requests.parquet
    return rows


def check_token_rows(out: Path, rows: pd.DataFrame) -> None:
    """Locust's TTFT / ITL / TPOT rows count exactly what the client rows hold, warm-up apart."""
    stats = read_locust_stats(out)
    for is_warmup, suffix in ((False, ""), (True, WARMUP_SUFFIX)):
        part = rows[rows["is_warmup"] == is_warmup]
        assert locust_count(stats, "LLM", TTFT_ROW + suffix) == part["ttft_s"].notna().sum()
        assert locust_count(stats, "LLM", TPOT_ROW + suffix) == part["tpot_s"].notna().sum()
        assert locust_count(stats, "LLM", ITL_ROW + suffix) == sum(len(gaps) for gaps in part["itl_s"])


def check_times(rows: pd.DataFrame) -> None:
    """Every row's moments in order; TTFT <= E2E wherever text came back.

    NOTE: a random dummy model may answer only special tokens, which decode to no text: such a
    request has its tokens (usage) but no first content token, hence no TTFT.
    """
    assert rows["first_token_time"].notna().sum() > len(rows) / 2
    for row in rows.itertuples():
        assert row.send_time <= row.first_byte_time <= row.end_time
        times = list(row.token_times)
        if not times:
            assert pd.isna(row.first_token_time) and pd.isna(row.ttft_s) and row.num_output_tokens > 0
            continue
        assert row.first_byte_time <= row.first_token_time <= row.end_time
        assert row.ttft_s <= row.e2e_s
        assert times == sorted(times) and times[0] == row.first_token_time and times[-1] <= row.end_time


def test_diagnose_the_dummy_model(tmp_path) -> None:
    out = tmp_path / "run"
    result = run_cli("diagnose", "--model", MODEL, "--duration", "5", "--warmup", "1", "--users", "4", *FAST_LOAD,
                     "--slo", "ttft=30,tpot=30", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bottleneck:" in result.stderr and "users-4" in result.stderr  # progress and summary on the terminal
    # Its output is a pipe here, as under `servescope diagnose ... 2>&1 | cat`, a CI log or `| tee`: the table
    # keeps every header and point label whole (rich would cut them to 80 columns: "users…", "ok/fa…").
    header = next(line for line in result.stderr.splitlines() if "TTFT p50/p99" in line)
    assert all(column in header for column in SUMMARY_COLUMNS), header
    assert "…" not in result.stderr and re.search(r"[│|] +users-4 +[│|]", result.stderr)  # the point's own row
    for name in RUN_FILES:
        assert (out / name).is_file(), name
    rows = check_nothing_lost(out)
    check_token_rows(out, rows)
    check_times(rows)
    assert rows["is_warmup"].any() and not rows["is_warmup"].all()
    # ignore_eos asks for exactly max_tokens; the byte-level prompt is as many tokens as planned.
    assert (rows["num_output_tokens"] == 8).all()
    assert (rows["num_prompt_tokens"] == rows["planned_prompt_tokens"]).all()

    diagnosis = json.loads((out / "diagnosis.json").read_text())
    assert {"bottleneck", "evidence", "metrics"} <= set(diagnosis)
    assert diagnosis["bottleneck"] in VERDICTS
    point = json.loads((out / "summary.json").read_text())["points"][0]
    client = point["client"]
    assert client["num_requests"] == int((~rows["is_warmup"]).sum()) == client["num_ok"]
    assert point["accounting"]["is_consistent"]
    assert client["goodput"]["fraction"] == 1.0
    assert point["server"]["max_batch"] >= 2  # four users: the engine batched them
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert client[name]["p50"] <= client[name]["p99"]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["workload"]["config"]["users"] == 4 and manifest["seeds"]["workload"] == 0
    # The roofs were measured before the server started (so before any load), in every dtype the CPU runs.
    peaks = json.loads((out / "machine_peaks.json").read_text())
    load = json.loads((out / "load.json").read_text())
    assert peaks["measured_at"] < manifest["started_at"] < load["started_at"]
    import torch

    from probes.peaks import native_peak_dtypes

    assert set(peaks["flops_by_dtype"]) == set(native_peak_dtypes(torch.device("cpu"))) and peaks["dtype"] == "float32"
    roofline = diagnosis["metrics"]["roofline"]
    assert all(roofline[k] is None or roofline[k] <= 1 for k in ("decode_mbu", "decode_mfu", "prefill_mbu",
                                                                 "prefill_mfu"))
    # Before the load, the step calibration: the run's own way and every execution lever of this CPU at several
    # batch sizes, in the server process; the verdict reads it at the run's own decode batch, and every lever it
    # timed is predicted, the numeric ones with their accuracy cost.
    calibration = json.loads((out / "step_calibration.json").read_text())
    assert calibration["run_path"] == "optimized" and "attention_backend=torch" in calibration["step_s"]
    assert "eager" not in calibration["step_s"]  # slower than the run's own path: not a lever
    assert calibration["batches"][0] == 1 and len(calibration["batches"]) >= 3
    levers = {lv["lever"]: lv for lv in diagnosis["levers"]}
    for name in calibration["step_s"]:
        if name != "optimized":
            assert levers[name]["predicted_gain"] is not None, name
            assert (levers[name]["accuracy"] is not None) == levers[name]["changes_numbers"], name
    assert manifest["started_at"] >= calibration["measured_at"] and calibration["measured_at"] < load["started_at"]
    paths = diagnosis["metrics"]["execution_paths"]
    assert paths["run_path"] == "optimized" and paths["batch"] >= 1 and paths["step_s"]["optimized"] > 0


@pytest.mark.slow
def test_two_worker_processes_merge_into_one_set_of_stats(tmp_path) -> None:
    out = tmp_path / "run"
    assert main(["diagnose", "--model", MODEL, "--execution", "eager", "--processes", "2", "--users", "4",
                 "--duration", "4", "--warmup", "1", *FAST_LOAD, "--out", str(out)]) == 0
    rows = check_nothing_lost(out)
    check_token_rows(out, rows)
    by_worker = rows.groupby("worker")
    assert set(by_worker.groups) == {"w0", "w1"} and (by_worker.size() > 0).all()
    # Worker i of 2 sends plan items i, i + 2, i + 4, ... (wrapping): the workers never repeat each other.
    num_planned = len((out / "workload.jsonl").read_text().splitlines())
    for index, worker in enumerate(("w0", "w1")):
        mine = rows[rows["worker"] == worker].sort_values("seq")
        assert list(mine["seq"]) == list(range(len(mine)))  # none of its requests missing
        assert list(mine["plan_index"]) == [(index + 2 * seq) % num_planned for seq in mine["seq"]]
    # Each worker process sampled its own health.
    workers = json.loads((out / "summary.json").read_text())["points"][0]["workers"]
    assert sorted(w["worker"] for w in workers) == ["w0", "w1"] and all(w["num_samples"] >= 3 for w in workers)


@pytest.mark.slow
@pytest.mark.real_model
def test_default_diagnose_as_readme_runs_it(tmp_path) -> None:
    """``servescope diagnose`` with no flags: the bundled smollm2-135m, a capacity search, about 5 minutes on 2 cores."""
    result = run_cli("diagnose", cwd=tmp_path, timeout_s=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    out = runs[0]
    diagnosis = json.loads((out / "diagnosis.json").read_text())
    assert diagnosis["bottleneck"] in VERDICTS and "Capacity:" in result.stderr
    capacity = diagnosis["capacity"]
    assert capacity["concurrency"] in [p["users"] for p in capacity["points"]]
    for point in capacity["points"]:
        rows = check_nothing_lost(out / f"users-{point['users']}")
        check_times(rows)
    summary = json.loads((out / "summary.json").read_text())
    assert all(p["model"] == "smollm2-135m" and p["client"]["num_ok"] > 0 for p in summary["points"])
    assert (out / "report.html").is_file()


@pytest.mark.slow
def test_diagnose_ablate_runs_every_lever_variant_and_reports_them(tmp_path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "ablate"
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.cli", "diagnose", "--model", "dummy:tiny", "--duration", "4", "--warmup",
         "1", "--users", "4", "--num-threads", "1", "--ablate", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    diagnosis = json.loads((out / "diagnosis.json").read_text())
    rows = {row["name"]: row for row in diagnosis["ablation"]["rows"]}
    from reports.ablation import STANDARD_VARIANTS

    assert set(rows) == {v.name for v in STANDARD_VARIANTS}
    assert rows["continuous"]["throughput_vs_baseline"] == 1.0
    assert rows["no-batching"]["bottleneck"] == "batching"
    assert (out / "report.html").read_text().count("Ablation") >= 1


@pytest.mark.parametrize("search", [False, True])
def test_the_tokenizer_is_loaded_before_a_server_starts_not_beside_it(tmp_path, monkeypatch, search: bool) -> None:
    """A starting server measures this machine's copy bandwidth (the roof of every share in the report); the
    tokenizer's load beside it on a 2-core machine halved the figure (17 against 31-38 GB/s)."""
    from rich.console import Console

    from loadtests.config import LoadConfig
    from loadtests.run import orchestrator

    events: list[str] = []

    class _Stop(Exception):
        pass

    def server_process(*args, **kwargs):
        events.append("server starts")
        raise _Stop

    monkeypatch.setattr(orchestrator, "load_tokenizer", lambda name: events.append(f"tokenizer {name}"))
    monkeypatch.setattr(orchestrator, "ServerProcess", server_process)
    real_peaks = orchestrator.measure_peaks
    monkeypatch.setattr(orchestrator, "measure_peaks", lambda: real_peaks(copy_mib=1, matmul_n=64, repeats=1))
    console = Console(quiet=True)
    with pytest.raises(_Stop):
        if search:
            orchestrator.run_diagnose_search(LoadConfig(users=1), tmp_path / "out", [], MODEL, console,
                                             orchestrator.SearchOptions(8))
        else:
            orchestrator.run_diagnose([LoadConfig(users=1)], tmp_path / "out", [], MODEL, console)
    assert events == [f"tokenizer {MODEL}", "server starts"]
