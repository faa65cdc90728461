"""The step-time model: a synthetic step table with known costs gives those costs back."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from reports.step_model import fit_step_model, nnls

KNOWN = {"overhead_s": 0.004, "prefill_token_s": 60e-6, "decode_seq_s": 300e-6, "context_token_s": 2e-6}


def synthetic_steps(n: int, noise: float, seed: int = 0, known: dict[str, float] = KNOWN,
                    host_overhead_s: float = 0.0, gap_every: int = 0) -> pd.DataFrame:
    """Back-to-back steps whose period is the known linear cost (times lognormal noise), as the steps probe writes them."""
    rng = np.random.default_rng(seed)
    prefill = rng.choice([0, 0, 0, 32, 128, 300], n)
    decode = rng.integers(1, 33, n)
    context = decode * rng.integers(50, 400, n)
    cost = (known["overhead_s"] + known["prefill_token_s"] * prefill + known["decode_seq_s"] * decode
            + known["context_token_s"] * context) * rng.lognormal(0.0, noise, n)
    total = cost + host_overhead_s
    gaps = np.where((np.arange(n) % gap_every == gap_every - 1) if gap_every else False, 1.0, 0.0)
    start = np.concatenate([[0.0], np.cumsum(total + gaps)[:-1]])
    return pd.DataFrame({"start_time": start, "total_s": total, "forward_s": cost * 0.7,
                         "host_overhead_s": host_overhead_s, "num_prefill_tokens": prefill,
                         "num_decode_tokens": decode, "num_kv_slots_used": context})


def test_known_coefficients_are_recovered() -> None:
    model = fit_step_model(synthetic_steps(2000, noise=0.05))
    assert model is not None
    for name, value in KNOWN.items():
        assert getattr(model.total, name) == pytest.approx(value, rel=0.1), name
    assert abs(model.holdout_total_error) < 0.02
    assert model.holdout_mape < 0.08  # the 5% noise, not a misfit
    assert model.forward.decode_seq_s == pytest.approx(0.7 * KNOWN["decode_seq_s"], rel=0.1)


def test_burnt_host_time_and_idle_gaps_are_left_out_of_the_fit() -> None:
    model = fit_step_model(synthetic_steps(1500, noise=0.02, host_overhead_s=0.02, gap_every=10))
    assert model is not None
    assert model.total.overhead_s == pytest.approx(KNOWN["overhead_s"], rel=0.1)
    assert model.num_fit_steps + model.num_holdout_steps < 1500 * 0.92  # the steps before a 1 s gap dropped


def test_a_cost_that_is_absent_stays_zero_never_negative() -> None:
    known = {**KNOWN, "context_token_s": 0.0}
    model = fit_step_model(synthetic_steps(1000, noise=0.2, known=known, seed=3))
    assert model is not None
    assert model.total.context_token_s >= 0.0
    assert model.total.context_token_s < 0.2e-6


def test_nnls_matches_the_unconstrained_fit_when_it_is_non_negative_and_clamps_otherwise() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nnls(a, a @ np.array([2.0, 0.5])) == pytest.approx([2.0, 0.5])
    x = nnls(a, a @ np.array([2.0, -0.5]))  # a falling line: the slope is clamped to 0, the level refitted
    assert x[1] == 0.0 and x[0] == pytest.approx(np.mean(a @ np.array([2.0, -0.5])))


def test_too_few_steps_give_no_model() -> None:
    assert fit_step_model(synthetic_steps(5, noise=0.0)) is None
