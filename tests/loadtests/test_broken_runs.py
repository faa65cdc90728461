"""Runs that go wrong get no verdict, a non-zero exit and the failure up front; refused fields are dropped."""

from __future__ import annotations

import json

import pytest

from loadtests.cli import main
from loadtests.client.table import load_client_requests
from probes.run_dir import DIAGNOSIS_NAME, MANIFEST_NAME, REPORT_NAME, RunDirectory
from reports.verdict.evidence import NO_VERDICT
from tests.loadtests.scripted_server import Misbehaviour, scripted_server

LOAD = ["--tokenizer", "dummy:tiny", "--workload", "fixed", "--max-tokens", "3", "--warmup", "0",
        "--stop-timeout", "10"]


def _load(url: str, out, *extra: str) -> int:
    return main(["load", "--target", url, "--users", "2", "--duration", "2", *LOAD, "--out", str(out), *extra])


def test_a_refused_ignore_eos_is_dropped_said_and_recorded(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    with scripted_server(Misbehaviour(reject_fields=("ignore_eos",))) as server:
        assert _load(server.url, out) == 0
    assert "refuses ignore_eos" in capsys.readouterr().err
    rows = load_client_requests(out)
    assert len(rows) > 0 and rows["is_ok"].all()  # every request of the load went without the field
    info = RunDirectory(out).load_info()
    assert info is not None and info.dropped_fields == ["ignore_eos"] and info.config["ignore_eos"] is False
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["workload"]["dropped_fields"] == ["ignore_eos"]
    assert json.loads((out / DIAGNOSIS_NAME).read_text())["bottleneck"] != NO_VERDICT


def test_a_target_that_refuses_every_request_is_a_clear_error_before_any_load(tmp_path, capsys) -> None:
    with scripted_server(Misbehaviour(fail_after=0)) as server:
        assert _load(server.url, tmp_path / "run") == 2
        assert server.num_requests == 1  # the probe request alone, no load against a broken target
    err = capsys.readouterr().err
    assert "refused the load's request: HTTP 500" in err and "the model crashed" in err


@pytest.mark.parametrize("misbehaviour", [Misbehaviour(fail_after=3), Misbehaviour(die_after=3)],
                         ids=["starts-failing", "dies"])
def test_a_target_that_breaks_mid_run_gets_no_verdict_and_a_non_zero_exit(tmp_path, capsys,
                                                                             misbehaviour: Misbehaviour) -> None:
    out = tmp_path / "run"
    with scripted_server(misbehaviour) as server:
        assert _load(server.url, out) == 1
    err = capsys.readouterr().err
    assert "no verdict" in err and "requests failed" in err
    diagnosis = json.loads((out / DIAGNOSIS_NAME).read_text())
    assert diagnosis["bottleneck"] == NO_VERDICT and diagnosis["evidence"] == []
    health = diagnosis["metrics"]["health"]
    assert not health["can_judge"] and health["num_failed"] > 0 and health["first_error"]
    expected_code = "500" if misbehaviour.fail_after is not None else None
    if expected_code:
        assert health["status_codes"].get(expected_code, 0) > 0 and "the model crashed" in health["first_error"]
    page = (out / REPORT_NAME).read_text(encoding="utf-8")
    assert "No verdict" in page and page.index('id="failure"') < page.index('id="timelines"')
    rows = load_client_requests(out)
    # Failed requests back off (doubling to 2 s): two users over about 2 s send a few dozen at most,
    # where a hot retry loop against a refusing port sends thousands.
    assert (~rows["is_ok"]).sum() < 100
    # `servescope report` on the broken run also gives no verdict, and says so with its exit status.
    from loadtests.cli import main as servescope

    assert servescope(["report", str(out)]) == 1
    assert json.loads((out / DIAGNOSIS_NAME).read_text())["bottleneck"] == NO_VERDICT


def test_a_target_that_cuts_every_stream_mid_token_gets_no_verdict(tmp_path) -> None:
    out = tmp_path / "run"
    with scripted_server(Misbehaviour(cut_mid_stream=True)) as server:
        assert _load(server.url, out) == 1
    rows = load_client_requests(out)
    assert len(rows) > 0 and not rows["is_ok"].any()
    assert json.loads((out / DIAGNOSIS_NAME).read_text())["bottleneck"] == NO_VERDICT


def test_a_server_that_answers_html_is_a_clear_error(tmp_path, capsys) -> None:
    with scripted_server(Misbehaviour(html=True)) as server:
        assert _load(server.url, tmp_path / "run") == 2
    assert "does not answer GET /v1/models as an OpenAI-compatible server" in capsys.readouterr().err
