"""The real scheduler on a simulated clock: admission, seats, memory and the clock behave as the engine's."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.simulator import SimRequest, SimStep, simulate


def _config(**changes: object) -> EngineConfig:
    values = {"model": "dummy:tiny", "max_model_len": 256, "max_num_batched_tokens": 256, "num_kv_blocks": 512,
              "block_size": 16, "max_num_seqs": 4, **changes}
    return EngineConfig(**values)  # type: ignore[arg-type]


def _requests(n: int, prompt: int = 20, output: int = 8) -> list[SimRequest]:
    return [SimRequest([1000 * i + j for j in range(prompt)], output, arrival_s=0.1 * i) for i in range(n)]


def test_closed_loop_respects_the_seat_cap_and_every_request_finishes_with_its_tokens() -> None:
    steps: list[SimStep] = []

    def cost(step: SimStep) -> float:
        steps.append(step)
        return 0.01

    run = simulate(_config(max_num_seqs=2), _requests(10), cost, users=6, stop_sending_s=1.0)
    assert max(s.num_seqs for s in steps) == 2  # 6 users, 2 seats: the cap binds and is never passed
    assert all(o.end_s is not None and o.first_token_s is not None for o in run.outcomes)
    assert not run.is_truncated
    # NOTE: each user sends again when its request ends, so no send lies after the deadline.
    assert max(o.send_s for o in run.outcomes) <= 1.0
    assert run.busy_s == pytest.approx(0.01 * len(steps))


def test_open_loop_sends_at_the_arrival_times_and_idles_between_them() -> None:
    requests = [SimRequest(list(range(10)), 4, arrival_s=t) for t in (0.0, 5.0)]
    run = simulate(_config(), requests, lambda step: 0.01, stop_sending_s=10.0)
    first, second = run.outcomes
    assert (first.send_s, second.send_s) == (0.0, 5.0)
    assert second.first_token_s == pytest.approx(5.01)  # the clock jumped over the idle gap
    assert run.busy_s < 0.1 < run.end_s


def test_a_small_pool_preempts_and_a_bigger_one_does_not() -> None:
    requests = _requests(8, prompt=40, output=60)
    small = simulate(_config(num_kv_blocks=16, max_num_seqs=8), requests, lambda s: 0.01, users=8, stop_sending_s=0.0)
    large = simulate(_config(num_kv_blocks=512, max_num_seqs=8), requests, lambda s: 0.01, users=8, stop_sending_s=0.0)
    assert sum(o.num_preemptions for o in small.outcomes) > 0
    assert sum(o.num_preemptions for o in large.outcomes) == 0
    assert large.end_s < small.end_s


def test_prefix_caching_shares_prompt_blocks_and_shortens_prefill() -> None:
    shared = list(range(64))
    requests = [SimRequest(shared + [500 + i], 2, arrival_s=float(i)) for i in range(4)]
    work: dict[bool, int] = {}
    for enabled in (True, False):
        run = simulate(_config(enable_prefix_caching=enabled), requests, lambda s: 0.01, stop_sending_s=10.0,
                       keep_steps=True)
        work[enabled] = sum(s.num_prefill_tokens for s in run.steps)
    assert work[False] == 4 * 65
    assert work[True] == 65 + 3 * 1  # later requests compute only the token after the 4 cached blocks


def test_context_counts_the_computed_tokens_of_running_requests() -> None:
    steps: list[SimStep] = []
    simulate(_config(), [SimRequest(list(range(20)), 3, arrival_s=0.0)], lambda s: steps.append(s) or 0.01,
             stop_sending_s=1.0)
    assert [s.num_context_tokens for s in steps] == [20, 21, 0]  # the last step finishes the request


def test_bad_input_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="empty"):
        simulate(_config(), [], lambda s: 0.01, stop_sending_s=1.0)
    with pytest.raises(ValueError, match="finalized"):
        simulate(EngineConfig(model="dummy:tiny"), _requests(1), lambda s: 0.01, stop_sending_s=1.0)
