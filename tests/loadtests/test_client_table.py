"""Client rows: the per-worker journals merge into one table, derived latencies computed once."""

from __future__ import annotations

import pytest

from loadtests.client.records import ClientRecord, Journal, journal_paths
from loadtests.client.table import load_client_requests, merge_journals


def record(worker: str, seq: int, send: float, **fields: object) -> ClientRecord:
    base = dict(worker=worker, seq=seq, plan_index=seq, group="", is_warmup=False, send_time=send,
                first_byte_time=send + 0.1, first_token_time=send + 0.2, end_time=send + 0.5,
                token_times=[send + 0.2, send + 0.3, send + 0.45], status_code=200, finish_reason="length",
                request_id=f"cmpl-{worker}-{seq}", num_prompt_tokens=10, num_output_tokens=4, has_usage=True,
                planned_prompt_tokens=10, max_tokens=4)
    base.update(fields)
    return ClientRecord(**base)  # type: ignore[arg-type]


def test_merge_sorts_by_send_time_and_derives_latencies(tmp_path) -> None:
    with Journal.in_run_dir(tmp_path, "w0") as j0, Journal.in_run_dir(tmp_path, "w1") as j1:
        j0.write(record("w0", 0, 10.0))
        j1.write(record("w1", 0, 5.0))
        j1.write(record("w1", 1, 20.0, status_code=503, error="HTTP 503: busy", first_token_time=None,
                        end_time=None, token_times=[], num_output_tokens=None))
    assert len(journal_paths(tmp_path)) == 2
    merge_journals(tmp_path)
    assert journal_paths(tmp_path) == []  # merged, then removed
    frame = load_client_requests(tmp_path)
    assert list(frame["worker"]) == ["w1", "w0", "w1"]
    ok = frame.iloc[0]
    assert ok["is_ok"] and ok["ttft_s"] == pytest.approx(0.2) and ok["e2e_s"] == pytest.approx(0.5)
    # 4 tokens, 0.3 s from the first to the finish: 3 more tokens, 0.1 s each on average.
    assert ok["tpot_s"] == pytest.approx(0.3 / 3)
    assert list(ok["itl_s"]) == pytest.approx([0.1, 0.15])
    failed = frame.iloc[2]
    assert not failed["is_ok"] and failed["error"] == "HTTP 503: busy"
    assert failed["ttft_s"] != failed["ttft_s"] and failed["e2e_s"] != failed["e2e_s"]  # NaN: never happened


def test_a_torn_last_line_is_dropped_and_a_torn_middle_line_is_an_error(tmp_path) -> None:
    with Journal.in_run_dir(tmp_path, "w0") as journal:
        journal.write(record("w0", 0, 1.0))
    path = journal_paths(tmp_path)[0]
    with open(path, "a") as f:
        f.write('{"worker": "w0", "seq": 1, "pl')  # the worker died mid-write
    merge_journals(tmp_path, remove=False)
    assert len(load_client_requests(tmp_path)) == 1
    with open(path, "a") as f:
        f.write("\n" + record("w0", 2, 3.0).to_json() + "\n")
    with pytest.raises(ValueError, match="is not a JSON record"):
        merge_journals(tmp_path)


def test_loading_a_directory_without_a_load_says_so(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no load was run"):
        load_client_requests(tmp_path)
