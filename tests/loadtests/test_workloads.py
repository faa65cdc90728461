"""Workloads are seeded, exact in length and made of real text."""

from __future__ import annotations

import pytest

from engine.weights import load_model
from loadtests.workloads.catalog import WORKLOADS, make_workload


@pytest.fixture(scope="module")
def tokenizer():
    return load_model("dummy:tiny").tokenizer


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_same_seed_same_requests_other_seed_other_requests(tokenizer, name: str) -> None:
    a = make_workload(name).items(12, tokenizer, seed=3)
    b = make_workload(name).items(12, tokenizer, seed=3)
    c = make_workload(name).items(12, tokenizer, seed=4)
    assert [(i.prompt_token_ids, i.max_tokens) for i in a] == [(i.prompt_token_ids, i.max_tokens) for i in b]
    assert [i.prompt_token_ids for i in a] != [i.prompt_token_ids for i in c]


def test_fixed_lengths_are_exact_and_text_is_real(tokenizer) -> None:
    items = make_workload("fixed", prompt_tokens=50, output_tokens=7).items(4, tokenizer, seed=0)
    assert all(len(i.prompt_token_ids) == 50 and i.max_tokens == 7 for i in items)
    assert all(len(i.prompt.split()) > 5 for i in items)


def test_caps_bound_every_length(tokenizer) -> None:
    items = make_workload("sharegpt-synth", max_prompt_tokens=64, max_output_tokens=16).items(200, tokenizer, 1)
    assert max(len(i.prompt_token_ids) for i in items) <= 64
    assert max(i.max_tokens for i in items) <= 16
    assert len({len(i.prompt_token_ids) for i in items}) > 10  # lengths really vary


def test_shared_prefix_groups_share_their_prefix(tokenizer) -> None:
    items = make_workload("shared-prefix", num_prefixes=3, prefix_tokens=40).items(9, tokenizer, seed=2)
    groups: dict[str, list[list[int]]] = {}
    for item in items:
        groups.setdefault(item.group, []).append(item.prompt_token_ids[:40])
    assert len(groups) == 3
    assert all(all(p == ps[0] for p in ps) for ps in groups.values())


def test_unknown_workload_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: .*sharegpt-synth"):
        make_workload("nope")
