"""The packed weights on one huge-page mapping (engine/cpu_kernels/huge_pages.py): same bytes, same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cpu_kernels import cpu_kernels
from engine.cpu_kernels.huge_pages import HUGE_PAGE, HugePageArena, kernel_projections
from engine.model_runner import ModelRunner
from engine.weights import load_model

KERNELS, WHY = cpu_kernels()
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    """The kernel's transparent huge page mode (the bracketed word), None where it has none."""
    try:
        text = THP.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


def test_the_arena_hands_out_aligned_copies_and_refuses_to_overflow() -> None:
    arena = HugePageArena(3 * 1000 + 200)
    first = torch.arange(250, dtype=torch.int32).view(10, 25)
    second = torch.randn(7, 3, dtype=torch.bfloat16)
    a, b = arena.take(first), arena.take(second)
    assert torch.equal(a, first) and torch.equal(b, second)
    assert a.dtype == first.dtype and b.shape == second.shape
    assert a.data_ptr() % HUGE_PAGE == 0 and b.data_ptr() % 64 == 0 and b.data_ptr() >= a.data_ptr() + 1000
    first.zero_()
    assert a.sum() > 0  # a copy, not the caller's memory
    with pytest.raises(ValueError, match="bytes left"):
        arena.take(torch.empty(3000, dtype=torch.uint8))


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason=f"transparent huge pages are {_thp_mode()} here")
def test_the_arena_is_backed_by_huge_pages_where_the_kernel_gives_them() -> None:
    arena = HugePageArena(8 * HUGE_PAGE)
    arena.take(torch.ones(8 * HUGE_PAGE, dtype=torch.uint8))
    assert arena.huge_bytes() > 0


def _llm(**overrides: object) -> LLM:
    loaded = load_model("dummy:tiny", torch.float32)
    return LLM("dummy:tiny", loaded=loaded, weights="int4", device="cpu", block_size=8, **overrides)


@pytest.mark.skipif(KERNELS is None, reason=f"the CPU kernels cannot be built here: {WHY}")
def test_every_kernel_projection_reads_the_arena_and_the_tokens_do_not_change(monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = [[5, 6, 7], [100] * 20, list(range(40, 57))]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    moved = _llm()
    runner = moved.engine.runner
    arena = runner.weight_arena
    assert arena is not None
    projections = kernel_projections(runner.model)
    assert len(projections) == 4 * len(runner.model.model.layers) + 1  # every layer's four and the head
    start = projections[0].packed.data.data_ptr()
    assert all(start <= p.packed.data.data_ptr() < start + arena.nbytes for p in projections)
    assert _llm(execution="eager").engine.runner.weight_arena is None

    monkeypatch.setattr(ModelRunner, "_weights_onto_huge_pages", lambda self: None)
    in_place = _llm()
    assert in_place.engine.runner.weight_arena is None
    assert [o.token_ids for o in moved.generate(prompts, params)] == \
        [o.token_ids for o in in_place.generate(prompts, params)]
