"""What the probed server calibrates at: the load's typical decode context and prompt step, read from its plan."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from loadtests.config import LoadConfig
from loadtests.run.probed_server import representative_load
from loadtests.workloads.tokenizer import load_tokenizer
from probes.step_calibration import DEFAULT_CONTEXT

TOKENIZER = load_tokenizer("dummy:tiny")


def engine(seats: int, budget: int) -> Any:
    return SimpleNamespace(tokenizer=TOKENIZER, config=SimpleNamespace(max_model_len=2048, max_num_seqs=seats,
                                                                       max_num_batched_tokens=budget))


def fixed(**load: Any) -> dict[str, Any]:
    return {"config": LoadConfig(workload="fixed", max_tokens=32, num_plan_items=8, **load).to_dict()}


def test_the_prompt_step_is_as_many_prompts_as_sequences_start_together_cut_to_the_budget() -> None:
    context, prompt_step = representative_load(fixed(users=2), engine(seats=16, budget=512))
    prompt = context - 16  # the fixed workload's prompt; half of the 32 output tokens is the rest of the context
    assert prompt > 0 and prompt_step == 2 * prompt
    # 16 users on 16 seats: their prompts fill the budget
    assert representative_load(fixed(users=16), engine(seats=16, budget=512)) == (context, 512)
    # many users queue behind 2 seats: two prompts at a time
    assert representative_load(fixed(users=32), engine(seats=2, budget=512))[1] == 2 * prompt
    # a capacity search raises its users up to max_users, an open loop queues for the seats
    assert representative_load({**fixed(users=1), "max_users": 64}, engine(seats=16, budget=512))[1] == 512
    assert representative_load(fixed(rate=2.0), engine(seats=1, budget=512))[1] == prompt


def test_an_unknown_load_leaves_the_calibration_its_defaults() -> None:
    assert representative_load(None, engine(seats=16, budget=512)) == (DEFAULT_CONTEXT, None)
