"""The replay's inputs: the closed loop's time outside the engine, which the replay adds to every request a user
sends, and the window a point's stopping rule decided."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from reports.dataset import RunDataset
from reports.levers.predictions import predict_levers
from reports.levers.replay_inputs import closed_loop_gap_s, replay_inputs

FIXTURES = Path(__file__).parent / "fixtures"


def _loop(users: int, num: int, in_engine_s: float, outside_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``users`` closed-loop users, each request ``in_engine_s`` in the engine and ``outside_s`` outside it (the
    transport both ways and the client), the client's E2E being both."""
    client, engine = [], []
    cycle = in_engine_s + outside_s
    for i in range(num):
        send = (i // users) * cycle + (i % users) * cycle / users
        arrival = send + outside_s / 2
        client.append({"request_id": f"r{i}", "send_time": send, "e2e_s": cycle})
        engine.append({"request_id": f"r{i}", "arrival_time": arrival, "finish_time": arrival + in_engine_s})
    return pd.DataFrame(client), pd.DataFrame(engine)


def test_the_gap_is_what_a_user_spends_outside_the_engine_transport_included() -> None:
    client, engine = _loop(users=2, num=200, in_engine_s=0.004, outside_s=0.040)
    assert closed_loop_gap_s(client, 2, engine) == pytest.approx(0.040, rel=0.02)
    # from the client's rows alone the transport counts as engine time, and nothing is left outside
    assert closed_loop_gap_s(client, 2) == pytest.approx(0.0, abs=0.001)


def test_a_request_the_engine_did_not_record_counts_by_its_client_e2e() -> None:
    client, engine = _loop(users=2, num=200, in_engine_s=0.004, outside_s=0.040)
    some = engine.iloc[::2]  # half the requests missing from the engine's rows
    gap = closed_loop_gap_s(client, 2, some)
    assert 0.015 < gap < 0.025  # half of them still count their whole cycle as engine time


def test_a_point_its_stopping_rule_ended_early_replays_its_window_not_its_duration_cap() -> None:
    """Recorded (2026-12-07 02:51 UTC, rep19 run 2, 12 users, smollm2-135m on 2 cores, ``--duration 60``): the
    point's interval was within ±5% after 26 s and its users stopped there. Replayed for the 60 s cap, the
    replay sent on where the load had stopped while the measured rate counted the drain: +85.6%. (The plan is
    cut to its first 200 requests; the point sent 53.)"""
    data = RunDataset.load(FIXTURES / "early_stop")
    window = data.load_info.window
    _, load = replay_inputs(data)
    assert load.duration_s == pytest.approx(window["stop_at"] - window["measure_from"])
    assert load.duration_s < 30.0 < data.load_config["duration_s"]
    check = predict_levers(data).replay_check
    assert abs(check["throughput_error"]) < 0.05
