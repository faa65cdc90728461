"""servescope serve under closed-loop HTTP load, recorded through the pytest plugin's ``llm_benchmark``.

Per-request TTFT and E2E are the benchmark rounds (``test_serve_closed_loop[1-ttft]`` ...), so
``pytest --benchmark-only --benchmark-autosave`` then ``--benchmark-compare --benchmark-compare-fail=median:20%``
gates them; output tok/s, goodput and the verdict are in each benchmark's extra_info. The server is started
once for the module (``llm_server``, parametrized with its flags); with ``--llm-target`` these are skipped.
"""

from __future__ import annotations

import pytest

# NOTE: the real weights: a random-weight model's stream can carry no text at all (dummy:smollm2-shape's
# tokens decode to nothing), which leaves the client no first token to time.
SERVER_FLAGS = "--model smollm2-135m --seed 0"

pytestmark = [pytest.mark.parametrize("llm_server", [SERVER_FLAGS], indirect=True, ids=["smollm2-135m"]),
              pytest.mark.benchmark(group="serve"), pytest.mark.real_model]


@pytest.mark.parametrize("users", [1, 4])
def test_serve_closed_loop(llm_benchmark, users: int) -> None:  # noqa: ANN001 - the plugin's fixture
    run = llm_benchmark(users=users, duration=30, warmup=5, workload="sharegpt-synth", max_tokens=32,
                        slo={"ttft": 2.0, "tpot": 0.2})
    print(f"\n{run.describe()}")
    assert run.num_failed == 0
    assert run.num_ok > 0
    assert run.verdict.bottleneck is not None, run.verdict.summary
