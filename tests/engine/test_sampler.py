"""The sampler's draw: the distribution it is given, nothing outside it, the same tokens for the same seed."""

from __future__ import annotations

import torch

from engine.sampler import Sampler, draw
from engine.sampling_params import SamplingParams

# chi-square with 5 degrees of freedom: exceeded with probability 0.001 by a correct sampler
CHI2_5_DOF_999 = 20.52


def test_draws_follow_the_distribution_and_never_a_zero_probability_token() -> None:
    probs = torch.tensor([0.0, 0.05, 0.10, 0.0, 0.15, 0.20, 0.0, 0.50, 0.0])  # six tokens with mass, three without
    generator = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.bincount(torch.tensor([draw(probs, generator) for _ in range(n)]), minlength=len(probs))
    assert counts[probs == 0].sum() == 0
    expected = probs[probs > 0] * n
    chi2 = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_5_DOF_999, (counts.tolist(), chi2)


def test_a_vocabulary_sized_row_with_a_top_k_mask_draws_only_inside_it_and_repeats_with_its_seed() -> None:
    logits = torch.randn(2, 49152, generator=torch.Generator().manual_seed(1)) * 3
    top = set(torch.topk(logits[0], 5).indices.tolist())
    params = [SamplingParams(temperature=1.0, top_k=5, seed=11), SamplingParams(temperature=0.7, seed=12)]
    runs = []
    for _ in range(2):
        sampler = Sampler(seed=0)
        runs.append([sampler.sample(logits, ["a", "b"], params).token_ids for _ in range(200)])
    assert runs[0] == runs[1]
    assert {tokens[0] for tokens in runs[0]} <= top and len({tokens[0] for tokens in runs[0]}) > 1
    assert len({tokens[1] for tokens in runs[0]}) > 50  # the unmasked row spreads over the vocabulary


def test_probabilities_that_do_not_sum_to_one_are_drawn_in_proportion() -> None:
    generator = torch.Generator().manual_seed(3)
    probs = torch.tensor([3.0, 1.0])  # an unnormalized row: 3 to 1
    share = sum(draw(probs, generator) == 0 for _ in range(8000)) / 8000
    assert abs(share - 0.75) < 0.02  # 4.1 standard deviations


def test_a_row_longer_than_a_chunk_draws_across_chunks_in_proportion_and_skips_empty_ones() -> None:
    # 2,500 tokens: three chunks of the two-level draw, the last one partial; mass in the first and the last only
    probs = torch.zeros(2500)
    probs[[3, 1023, 2049, 2499]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    generator = torch.Generator().manual_seed(4)
    n = 20000
    counts = torch.bincount(torch.tensor([draw(probs, generator) for _ in range(n)]), minlength=len(probs))
    assert counts.sum() == counts[[3, 1023, 2049, 2499]].sum() == n
    expected = probs[probs > 0] * n
    chi2 = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, (counts[probs > 0].tolist(), chi2)  # 3 degrees of freedom, p = 0.001


def test_a_draw_that_rounds_onto_the_total_lands_on_the_last_token_with_probability(monkeypatch) -> None:
    probs = torch.zeros(1025)  # two chunks, the second (one real token and the padding) without mass
    probs[3], probs[700] = 0.5, 0.5
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: torch.ones(1, dtype=torch.float64))  # u = 1
    assert draw(probs, torch.Generator()) == 700


def test_greedy_rows_take_torchs_argmax_first_maximum_and_nan_alike() -> None:
    """The greedy pick (numpy's argmax for float32 logits) is torch's: the first of equal maxima, a NaN first."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, float("nan"), 9.0, float("nan")], [-1.0, -1.0, -1.0, -2.0]])
    sampler = Sampler(seed=0)
    greedy = [SamplingParams(temperature=0.0)] * 3
    want = logits.argmax(dim=-1).tolist()
    assert want == [1, 1, 0]
    for dtype in (torch.float32, torch.bfloat16):
        assert sampler.sample(logits.to(dtype), ["a", "b", "c"], greedy).token_ids == want
    mixed = [greedy[0], SamplingParams(temperature=1.0, seed=1), greedy[2]]
    tokens = sampler.sample(logits, ["a", "b", "c"], mixed).token_ids
    assert tokens[0] == 1 and tokens[2] == 0
