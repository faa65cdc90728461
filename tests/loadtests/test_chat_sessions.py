"""``--workload chat-sessions``: turns that resend the whole history, and the prefix-cache hits they earn."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from engine.weights import load_model
from loadtests.cli import main
from loadtests.client.table import load_client_requests
from loadtests.config import LoadConfig
from loadtests.plan import read_plan
from loadtests.run.server_process import ServerProcess
from loadtests.workloads.catalog import make_workload

TURNS = 3


def test_sessions_are_consecutive_turns_of_one_group() -> None:
    items = make_workload("chat-sessions", num_turns=TURNS).items(7, load_model("dummy:tiny").tokenizer, seed=1)
    assert len(items) == 9  # three whole sessions cover 7 requests
    assert [i.turn for i in items] == [0, 1, 2] * 3
    assert [i.group for i in items] == [f"session-{s}" for s in range(3) for _ in range(TURNS)]


def test_chat_sessions_need_the_chat_api_and_users() -> None:
    with pytest.raises(ValueError, match="--api chat"):
        LoadConfig(users=2, workload="chat-sessions", api="completions")
    with pytest.raises(ValueError, match="give --users"):
        LoadConfig(rate=2.0, workload="chat-sessions", api="chat")


@pytest.mark.usefixtures("without_execution_reference")
def test_each_turn_resends_the_history_and_hits_the_prefix_cache(tmp_path, dummy_server: ServerProcess) -> None:
    out = tmp_path / "run"
    assert main(["load", "--target", dummy_server.url, "--tokenizer", "dummy:tiny", "--workload", "chat-sessions",
                 "--turns", str(TURNS), "--users", "2", "--duration", "6", "--warmup", "0", "--max-tokens", "8",
                 "--stop-timeout", "30", "--out", str(out)]) == 0
    plan = read_plan(out / "workload.jsonl")
    rows = load_client_requests(out)
    assert rows["is_ok"].all() and len(rows) >= TURNS
    rows["turn"] = [plan[i].turn for i in rows["plan_index"]]
    resent = 0
    sessions = []
    for _, sent in rows.groupby(["worker", "group"]):
        # NOTE: a user that runs through the plan's sessions starts them again from turn 0: each pass is a session
        sent = sent.sort_values("send_time")
        sessions += [passed for _, passed in sent.groupby((sent["turn"] == 0).cumsum().to_numpy())]
    for session in sessions:
        turns = list(session["turn"])
        assert turns == list(range(len(turns))), "a session's turns go out in order, once each"
        prompt, cached = list(session["num_prompt_tokens"]), list(session["num_cached_tokens"])
        for k in range(1, len(turns)):
            # the whole history (last prompt, its reply, the new message) is sent again
            assert prompt[k] >= prompt[k - 1] + int(session["planned_prompt_tokens"].iloc[k])
            assert cached[k] > 0, "the history is served from the prefix cache"
        resent += len(turns) >= 2
    # A session whose second turn went out inside the window shows the resend; a whole three-turn session
    # is not required, since on a loaded machine a turn can take seconds.
    assert resent >= 1
    # The report's hit rate (from the responses' usage) agrees with the server's own /metrics counters.
    report = (out / "report.html").read_text()
    match = re.search(r"prefix-cache hit rate</td><td>([\d.]+)% of prompt tokens", report)
    assert match is not None
    scrapes = pd.read_parquet(out / "prometheus.parquet")
    counters = scrapes[scrapes["sample"].isin(["vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"])]
    growth = counters.groupby("sample")["value"].agg(lambda v: v.iloc[-1] - v.iloc[0])
    server_rate = growth["vllm:prefix_cache_hits_total"] / growth["vllm:prefix_cache_queries_total"]
    assert server_rate > 0.1
    assert float(match.group(1)) / 100 == pytest.approx(server_rate, abs=0.01)
