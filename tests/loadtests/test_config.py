"""Load settings: the flag syntaxes, the derived values, and bad inputs that must fail clearly."""

from __future__ import annotations

import pytest

from loadtests.config import DEFAULT_BURST_SIZE, LoadConfig, parse_slo, parse_sweep


def test_sweep_and_slo_syntax() -> None:
    assert parse_sweep("users=1,4,16,64") == ("users", [1.0, 4.0, 16.0, 64.0])
    assert parse_sweep("rate=0.5, 2") == ("rate", [0.5, 2.0])
    assert parse_slo("ttft=0.5,tpot=0.05") == {"ttft": 0.5, "tpot": 0.05}


@pytest.mark.parametrize(("text", "message"), [
    ("batch=1,2", "users=1,4,16 or rate"), ("users", "users=1,4,16 or rate"), ("users=", "lists no values"),
    ("users=1,x", "must be numbers"), ("users=2,2", "repeats"),
])
def test_bad_sweeps(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_sweep(text)


def test_bad_slos() -> None:
    with pytest.raises(ValueError, match="ttft=0.5"):
        parse_slo("ttft")
    with pytest.raises(ValueError, match="not a number"):
        parse_slo("ttft=fast")
    with pytest.raises(ValueError, match="unknown SLO metrics"):
        LoadConfig(users=1, slo={"latency": 1.0})
    with pytest.raises(ValueError, match="> 0 seconds"):
        LoadConfig(users=1, slo={"ttft": 0.0})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "exactly one of users"), ({"users": 2, "rate": 1.0}, "exactly one of users"),
    ({"users": 0}, "users must be >= 1"), ({"rate": -1.0}, "rate must be a positive"),
    ({"users": 1, "duration_s": 0}, "duration must be > 0"), ({"users": 1, "workload": "nope"}, "unknown workload"),
    ({"users": 1, "processes": 2}, "at least as many users as processes"),
    ({"users": 4, "workload": "burst"}, "give --rate"), ({"users": 4, "burst_size": 3}, "needs an open loop"),
    ({"users": 4, "burstiness": 0.5}, "open-loop gaps"), ({"rate": 1.0, "burstiness": 0}, "burstiness must be > 0"),
    ({"rate": 1.0, "api": "embeddings"}, "api must be one of"),
])
def test_bad_configs(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadConfig(**kwargs)  # type: ignore[arg-type]


def test_points_and_bursts() -> None:
    base = LoadConfig(users=8)
    assert base.point_name == "users-8" and not base.is_open_loop
    at_rate = base.at_point("rate", 2.5)
    assert (at_rate.users, at_rate.rate, at_rate.point_name) == (None, 2.5, "rate-2.5")
    assert base.at_point("users", 16).users == 16
    with pytest.raises(ValueError, match="whole numbers"):
        base.at_point("users", 1.5)
    assert LoadConfig(rate=4.0, workload="burst").burst_size == DEFAULT_BURST_SIZE
    assert LoadConfig(rate=4.0).burst_size == 1
