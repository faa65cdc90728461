"""The pieces of llm_benchmark and llm_load that need no server: names, the rate check, the load keywords."""

from __future__ import annotations

import argparse

import pytest

from loadtests.pytest_plugin.benchmark import RateCheck, parse_rate_check, with_metric
from loadtests.pytest_plugin.load_point import load_config


def test_each_metric_is_a_benchmark_named_like_a_parameter() -> None:
    assert with_metric("test_chat", "ttft") == "test_chat[ttft]"
    assert with_metric("t.py::test_chat[4-fixed]", "e2e") == "t.py::test_chat[4-fixed-e2e]"


def test_the_rate_check_fails_only_past_its_threshold() -> None:
    check = parse_rate_check("output_tokens_per_s:10%")
    assert check == RateCheck("output_tokens_per_s", 10.0)
    assert check.fails(now=95.0, base=100.0) is None
    assert check.fails(now=120.0, base=100.0) is None
    assert check.fails(now=80.0, base=100.0) == ("output tok/s fell 20.0% (100 -> 80), more than "
                                                 "--llm-compare-fail output_tokens_per_s:10% allows")
    assert check.fails(now=float("nan"), base=100.0) is not None  # nothing measured now is a regression
    assert check.fails(now=1.0, base=0.0) is None  # nothing to fall from


@pytest.mark.parametrize("text", ["ttft:10%", "output_tokens_per_s:10", "output_tokens_per_s"])
def test_a_bad_rate_check_names_the_fields(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="output_tokens_per_s, requests_per_s, goodput_fraction"):
        parse_rate_check(text)


def test_load_keywords_become_the_load_config_of_servescope_load() -> None:
    config = load_config(users=4, duration=10, warmup=2, max_tokens=32, slo="ttft=0.5,e2e=2", processes=2)
    assert (config.users, config.duration_s, config.warmup_s, config.max_tokens) == (4, 10.0, 2.0, 32)
    assert config.slo == {"ttft": 0.5, "e2e": 2.0}
    assert config.processes == 2 and config.api == "completions"
    assert load_config(users=2, workload="chat-sessions").api == "chat"
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['user'\]; it takes users, rate"):
        load_config(user=4)
    with pytest.raises(ValueError, match="give exactly one of users"):
        load_config()
