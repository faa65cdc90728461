"""Overload is evidence, not a broken run: failures that come only with the load are read as the server's limit.

One real load (three users, through Locust) against a replay of llama-server that answers a request arriving
while another is in flight with its recorded "Context size has been exceeded" stream, as its shared KV pool
does when the requests at once outgrow it; the single-stream reference after the load (one at a time) gets
none. Copies of that run with its failed rows rewritten show the other readings without another load.
"""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stderr
from pathlib import Path

import pyarrow as pa
import pytest

from loadtests.cli import main
from loadtests.client.table import load_client_requests
from probes.run_dir import CLIENT_TABLE, DIAGNOSIS_NAME, REPORT_NAME, RunDirectory
from probes.schemas import CLIENT_REQUESTS
from probes.single_stream import SINGLE_STREAM_NAME, SingleStream
from reports.failures import failure_kind
from reports.verdict.diagnosis import diagnose
from reports.verdict.evidence import NO_VERDICT
from tests.loadtests.replay_server import fixture_text, recorded, replay_server

LOAD = ["--users", "3", "--duration", "2", "--warmup", "0", "--tokenizer", "dummy:tiny", "--workload", "fixed",
        "--max-tokens", "8", "--stop-timeout", "10"]


def _kv_limited(n: int, path: str, in_flight: int):
    return recorded("stream-kv-exhausted.http" if in_flight > 1 else "stream-completions.http")


@pytest.fixture(scope="module")
def kv_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("overload") / "kv"
    metrics = [fixture_text(f"metrics-{name}.txt") for name in ("idle", "busy", "busy", "after")]
    # NOTE: the close waits for the next request, so that every reuse is retried (the report says so) whatever the timing.
    with replay_server(close="after_next_request", answer=_kv_limited, chunk_gap_s=0.02, metrics=metrics) as server:
        err = io.StringIO()
        with redirect_stderr(err):
            code = main(["load", "--target", server.url, *LOAD, "--out", str(out)])
    return out, code, " ".join(err.getvalue().split())  # NOTE: the console wraps its lines


def _diagnosis(path: Path) -> dict:
    return json.loads((path / DIAGNOSIS_NAME).read_text())


def test_context_exhaustion_that_comes_with_the_load_reads_as_cache(kv_run) -> None:
    out, code, console = kv_run
    rows = load_client_requests(out)
    assert code == 0 and (~rows["is_ok"]).sum() > 0.2 * len(rows) and rows["is_ok"].any()
    diagnosis = _diagnosis(out)
    assert diagnosis["bottleneck"] == "cache" and diagnosis["deciding"] == ["overload_context"]
    failures = diagnosis["metrics"]["failures"][diagnosis["label"]]
    assert failures["by_kind"] == {"context_full": int((~rows["is_ok"]).sum())}
    assert failures["read_as"].startswith("overload") and "single-stream reference" in failures["read_as"]
    assert "out of context or KV cache; read as overload: evidence of the server's limit" in console
    assert "bottleneck: cache" in console
    page = (out / REPORT_NAME).read_text(encoding="utf-8")
    assert 'id="failures"' in page and "read as overload" in page and 'id="retried"' in page
    reference = RunDirectory(out).load(SINGLE_STREAM_NAME, SingleStream)
    assert reference is not None and reference.num_failed == 0 and reference.tpot_p50_s is not None
    # llama-server's own evidence came with it: its names, its slots (/props), its busy slots per decode.
    assert "llamacpp:requests_deferred" in diagnosis["metrics"]["metrics_read"]
    assert "4 slots of 512 tokens (/props)" in diagnosis["metrics"]["metrics_read"]


def _rewritten(tmp_path: Path, kv_run, error: str, status: int) -> Path:
    """A copy of the KV run whose failed rows carry ``status`` and ``error`` instead."""
    out = tmp_path / "copy"
    shutil.copytree(kv_run[0], out)
    rows = load_client_requests(out)
    failed = ~rows["is_ok"]
    rows.loc[failed, "error"], rows.loc[failed, "status_code"] = error, status
    RunDirectory(out).write_table(CLIENT_TABLE, pa.Table.from_pandas(rows, schema=CLIENT_REQUESTS,
                                                                       preserve_index=False))
    return out


def test_refusals_as_busy_that_come_with_the_load_read_as_seats(tmp_path, kv_run) -> None:
    out = _rewritten(tmp_path, kv_run, "HTTP 503: server busy", 503)
    result = diagnose(out)
    assert (result.bottleneck, result.deciding) == ("batching", ["overload_refused"])
    assert "seats" in result.summary


def test_every_request_out_of_context_at_the_load_is_still_cache(tmp_path, kv_run) -> None:
    # llama-server's unified KV pool (-kvu -c 512) runs out for every sequence at once: not one request of the
    # point succeeds, yet the single-stream reference after it held: the load found the limit.
    out = tmp_path / "all"
    shutil.copytree(kv_run[0], out)
    rows = load_client_requests(out)
    rows["is_ok"], rows["error"], rows["status_code"] = False, "Context size has been exceeded.", 200
    RunDirectory(out).write_table(CLIENT_TABLE, pa.Table.from_pandas(rows, schema=CLIENT_REQUESTS,
                                                                       preserve_index=False))
    result = diagnose(out)
    assert (result.bottleneck, result.deciding) == ("cache", ["overload_context"])


def test_the_same_failures_at_one_user_too_are_no_verdict(tmp_path, kv_run) -> None:
    out = _rewritten(tmp_path, kv_run, "Context size has been exceeded.", 200)
    reference = RunDirectory(out).load(SINGLE_STREAM_NAME, SingleStream)
    assert reference is not None
    reference.errors = [{"status_code": 200, "error": "Context size has been exceeded."}] * reference.num_requests
    RunDirectory(out).save(SINGLE_STREAM_NAME, reference)
    result = diagnose(out)
    assert result.bottleneck == NO_VERDICT and "failures at every load" in result.summary


def test_failures_that_say_the_run_is_broken_are_no_verdict_whatever_the_load(tmp_path, kv_run) -> None:
    out = _rewritten(tmp_path, kv_run, "HTTP 500: internal error: the model crashed", 500)
    result = diagnose(out)
    assert result.bottleneck == NO_VERDICT and "not from overload" in result.summary


@pytest.mark.parametrize(("status", "error", "kind"), [
    (400, "HTTP 400: " + recorded("error-too-long.http").body().decode(), "context_full"),
    (200, "Context size has been exceeded.", "context_full"),  # llama-server's in-stream error, unified KV full
    (0, "RemoteDisconnected: Remote end closed connection without response", "dropped"),
    (200, "the stream ended without a finish_reason", "dropped"),
    (0, "TimeoutError: timed out", "timed_out"),
    (503, "HTTP 503: Service Unavailable", "refused_busy"),
    (429, "HTTP 429: Too Many Requests", "refused_busy"),
    (0, "ConnectionRefusedError: [Errno 111] Connection refused", "unreachable"),
    (500, "HTTP 500: internal error: the model crashed", "server_error"),
    (422, "HTTP 422: Unexpected fields in the request: {'ignore_eos'}", "client_error"),
])
def test_each_failure_is_read_by_its_kind(status: int, error: str, kind: str) -> None:
    assert failure_kind(status, error) == kind


def _kv_over_two(n: int, path: str, in_flight: int):
    return recorded("stream-kv-exhausted.http" if in_flight > 2 else "stream-completions.http")


@pytest.mark.slow
def test_a_capacity_search_stops_where_overload_begins_and_reads_its_failures(tmp_path) -> None:
    out = tmp_path / "search"
    with replay_server(close="at_once", answer=_kv_over_two, chunk_gap_s=0.02) as server:
        code = main(["load", "--target", server.url, "--duration", "2", "--warmup", "0", "--tokenizer", "dummy:tiny",
                     "--workload", "fixed", "--max-tokens", "8", "--stop-timeout", "10", "--max-users", "8",
                     "--out", str(out)])
    assert code == 0
    search = json.loads((out / "capacity.json").read_text())
    assert search["failed_at"]["users"] == 4 and "out of context or KV cache" in search["failed_at"]["why"]
    assert "overload is the limit" in search["stopped"] and max(search["order"]) == 4
    diagnosis = _diagnosis(out)
    assert diagnosis["label"] == "users-4" and diagnosis["bottleneck"] == "cache"
    assert diagnosis["deciding"] == ["overload_context"]
