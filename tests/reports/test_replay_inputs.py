"""The closed loop's time outside the engine, which the replay adds to every request a user sends."""

from __future__ import annotations

import pandas as pd
import pytest

from reports.levers.replay_inputs import closed_loop_gap_s


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
