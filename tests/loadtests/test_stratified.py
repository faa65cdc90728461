"""A controlled point's request lengths: a stratified deck that carries the workload's mix in every stretch."""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from loadtests.config import LoadConfig, StopRule
from loadtests.plan import build_plan
from loadtests.workloads.catalog import make_workload
from loadtests.workloads.stratified import DECK_SIZE, stratified_deck
from tests.loadtests.test_plan import TOKENIZER


def test_the_deck_stands_for_the_distribution_and_every_stretch_of_it_for_the_deck() -> None:
    workload = make_workload("sharegpt-synth", max_output_tokens=64)
    rng = random.Random(0)
    drawn = np.array([workload.sized(rng) for _ in range(20_000)], dtype=float)
    deck = np.array(stratified_deck(workload.sized, random.Random(1)), dtype=float)
    assert len(deck) == DECK_SIZE
    assert abs(deck[:, 0].mean() / drawn[:, 0].mean() - 1) < 0.05  # prompts: the heavy tail's mean kept
    assert abs(deck[:, 1].mean() / drawn[:, 1].mean() - 1) < 0.05
    # Any 12 consecutive requests of the dealt sequence carry about their share of the prompt tokens: far
    # closer than 12 drawn one by one (a log-normal tail: one 1024-token prompt is five average ones).
    dealt = np.tile(deck[:, 0], 4)
    stretches = np.array([dealt[i:i + 12].sum() for i in range(DECK_SIZE)])
    draws = np.array([drawn[i:i + 12, 0].sum() for i in range(0, 12_000, 12)])
    assert stretches.std() / stretches.mean() < 0.6 * draws.std() / draws.mean()


def test_a_controlled_points_plan_deals_the_deck_with_fresh_text_and_others_draw_as_before() -> None:
    base = LoadConfig(users=4, max_tokens=64, num_plan_items=3 * DECK_SIZE, seed=2)
    dealt = build_plan(dataclasses.replace(base, stop_rule=StopRule()), TOKENIZER, None)
    lengths = [(p.num_prompt_tokens, p.max_tokens) for p in dealt]
    assert lengths[:DECK_SIZE] == lengths[DECK_SIZE:2 * DECK_SIZE]  # the deck again...
    assert dealt[0].prompt != dealt[DECK_SIZE].prompt  # ...with new text: no prefix-cache hits by repetition
    drawn = build_plan(base, TOKENIZER, None)
    assert [(p.num_prompt_tokens, p.max_tokens) for p in drawn][:DECK_SIZE] != lengths[:DECK_SIZE]

