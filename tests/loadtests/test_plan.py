"""The request plan: seeded, cut to the server's context length, saved and read back unchanged."""

from __future__ import annotations

import pytest

from loadtests.config import LoadConfig
from loadtests.plan import CHAT_TEMPLATE_MARGIN, build_plan, read_plan, write_plan
from loadtests.workloads.tokenizer import load_tokenizer

TOKENIZER = load_tokenizer("dummy:tiny")


def test_same_seed_same_plan_and_it_round_trips(tmp_path) -> None:
    config = LoadConfig(users=2, workload="sharegpt-synth", max_tokens=32, num_plan_items=20, seed=5)
    plan = build_plan(config, TOKENIZER, max_model_len=None)
    assert plan == build_plan(config, TOKENIZER, max_model_len=None)
    assert plan != build_plan(LoadConfig(users=2, max_tokens=32, num_plan_items=20, seed=6), TOKENIZER, None)
    assert [p.index for p in plan] == list(range(20)) and all(p.max_tokens <= 32 for p in plan)
    assert read_plan(write_plan(tmp_path / "workload.jsonl", plan)) == plan


@pytest.mark.parametrize(("workload", "api"), [("long-context", "completions"), ("shared-prefix", "chat")])
def test_prompts_are_cut_to_fit_the_servers_context(workload: str, api: str) -> None:
    max_model_len = 300
    config = LoadConfig(users=1, workload=workload, api=api, num_plan_items=12)
    plan = build_plan(config, TOKENIZER, max_model_len)
    margin = CHAT_TEMPLATE_MARGIN if api == "chat" else 0
    for item in plan:
        assert item.num_prompt_tokens + item.max_tokens + margin <= max_model_len
        assert len(TOKENIZER.encode(item.prompt)) == item.num_prompt_tokens  # byte-level: exact
    assert any(item.num_prompt_tokens + item.max_tokens + margin == max_model_len for item in plan)  # cut, not dropped


def test_no_room_for_any_prompt_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="lower --max-tokens"):
        build_plan(LoadConfig(users=1, workload="fixed", max_tokens=64, num_plan_items=2), TOKENIZER, max_model_len=64)
