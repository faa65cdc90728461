"""A user's own test file, as docs/pytest.md's examples: any OpenAI-compatible server, given by --llm-target."""

import pytest

from loadtests.pytest_plugin import check_slo


def test_one_user_is_served(llm_load):
    run = llm_load(users=1, duration=10, warmup=2, max_tokens=32)
    print(run.describe())
    assert run.num_failed == 0
    assert run.e2e.p50 < 10.0  # on failure pytest prints the whole E2E distribution
    check_slo(run, e2e_p99=20.0, min_output_tokens_per_s=1.0)


@pytest.mark.llm_slo(max_failed=0, e2e_p90=30.0)
def test_four_users_within_the_slo(llm_load):
    run = llm_load(users=4, duration=10, warmup=2, max_tokens=32)
    print(run.describe())


def test_two_users_benchmark(llm_benchmark):
    run = llm_benchmark(users=2, duration=15, warmup=3, max_tokens=32)
    print(run.describe())
    assert run.num_failed == 0
