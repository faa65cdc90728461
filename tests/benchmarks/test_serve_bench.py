"""servescope serve under closed-loop HTTP load, recorded through the pytest plugin's ``llm_benchmark``.

Per-request TTFT and E2E are the benchmark rounds (``test_serve_closed_loop[1-ttft]`` ...), so
``pytest --benchmark-only --benchmark-autosave`` then ``--benchmark-compare --benchmark-compare-fail=median:20%``
gates them; output tok/s, goodput and the verdict are in each benchmark's extra_info. The server is started
once for the module (``llm_server``, parametrized with its flags); with ``--llm-target`` these are skipped.
"""

from __future__ import annotations

import pytest

# NOTE: the SmolLM2-135M shape with random weights: the real model's per-token work, with nothing to fetch.
SERVER_FLAGS = "--model dummy:smollm2-shape --max-model-len 512 --seed 0"

pytestmark = [pytest.mark.parametrize("llm_server", [SERVER_FLAGS], indirect=True, ids=["smollm2-shape"]),
              pytest.mark.benchmark(group="serve")]


@pytest.mark.parametrize("users", [1, 8])
def test_serve_closed_loop(llm_benchmark, users: int) -> None:  # noqa: ANN001 - the plugin's fixture
    run = llm_benchmark(users=users, duration=20, warmup=4, workload="sharegpt-synth", max_tokens=32,
                        slo={"ttft": 1.0, "tpot": 0.1})
    print(f"\n{run.describe()}")
    assert run.num_failed == 0
    assert run.num_ok > 0
    assert run.verdict.bottleneck is not None, run.verdict.summary
