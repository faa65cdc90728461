"""Drive a real engine through a small, seeded workload for the probe tests."""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine import LLMEngine, SamplingParams


@dataclass(slots=True)
class DrivenRun:
    """What the test driver saw: the ids it added, the steps it took, each request's final output length."""

    request_ids: list[str]
    num_steps: int
    num_output_tokens: dict[str, int]
    num_prompt_tokens: dict[str, int]


def random_prompts(seed: int, num_prompts: int, length: int, vocab: int = 256) -> list[list[int]]:
    """Distinct prompts, so runs of different tests never share a cached prefix."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(num_prompts)]


def drive(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, prefix: str) -> DrivenRun:
    """Add every prompt (ignoring EOS, so each yields ``max_tokens``) and step until all finish."""
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True), request_id=f"{prefix}-{i}")
           for i, p in enumerate(prompts)]
    outputs: dict[str, int] = {}
    steps_before = engine.num_steps
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = len(out.token_ids)
    return DrivenRun(list(ids), engine.num_steps - steps_before, outputs,
                     {rid: len(p) for rid, p in zip(ids, prompts, strict=True)})
