"""What an execution lever that changes the numbers (a dtype, quantized weights) costs in accuracy.

Measured on the served model before the load, beside the lever's step time (:mod:`probes.step_calibration`):
the run's own configuration continues a few fixed prompts greedily; then every configuration reads
each prompt and that continuation in one teacher-forced forward, and at every continuation position
the lever's logits are compared with the run's own:

- ``agreement``: the share of positions where the lever's greedy (top) token is the run's;
- ``max_logit_diff``: the largest absolute difference of any logit at any of those positions.

Teacher-forced, so one early disagreement does not turn every later token into a disagreement: each
position asks "given the same text so far, would the lever pick the same next token?".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

ACCURACY_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Photosynthesis is the process by which",
    "Once upon a time, in a small village,",
)
NUM_TOKENS = 8


@dataclass(slots=True)
class LeverAccuracy:
    """A lever's logits against the run's own on the same text (see the module's docstring)."""

    agreement: float  # share of positions whose top token is the run's
    max_logit_diff: float  # largest |logit difference| over those positions and the vocabulary
    num_positions: int
    num_prompts: int
    method: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeverAccuracy:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})

    def describe(self) -> str:
        return (f"agrees on {self.agreement:.0%} of greedy tokens, largest logit difference {self.max_logit_diff:.3g} "
                f"({self.num_positions} positions of {self.num_prompts} fixed prompts)")


def prompt_token_ids(tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """The fixed prompts in the served model's tokens (ids past its vocabulary folded back into it)."""
    return [[int(t) % vocab_size for t in tokenizer.encode(text)] or [1] for text in ACCURACY_PROMPTS]


def greedy_continuations(engine: Any, prompts: Sequence[list[int]], num_tokens: int = NUM_TOKENS) -> list[list[int]]:
    """``num_tokens`` greedy tokens after each prompt, by ``engine`` (the run's own configuration)."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(list(p), params, request_id=f"accuracy-reference-{i}") for i, p in enumerate(prompts)]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    for _ in range(len(prompts) * (num_tokens + 2) + 8):  # bounded: every request ends after num_tokens
        for out in engine.step():
            tokens[out.request_id] = list(out.token_ids)
        if not engine.has_unfinished():
            break
    return [tokens[rid][:num_tokens] for rid in ids]


def teacher_forced_logits(engine: Any, sequences: Sequence[list[int]]) -> list[torch.Tensor]:
    """Every position's logits ``[len(seq), vocab]`` (float32) of each whole sequence, computed by ``engine``'s own
    runner, a group of sequences per forward."""
    from engine import SamplingParams

    # NOTE: a prefix-cache hit would leave positions uncomputed; the calibration's prompts are cached.
    engine.scheduler.block_manager.reset_prefix_cache()
    budget, seats = int(engine.config.max_num_batched_tokens), int(engine.config.max_num_seqs)
    out: list[torch.Tensor] = []
    group: list[list[int]] = []
    for seq in [*sequences, None]:
        if seq is not None and len(seq) > budget:
            raise ValueError(f"a {len(seq)}-token sequence does not fit one step's budget of {budget} tokens")
        if group and (seq is None or len(group) == seats or sum(map(len, group)) + len(seq) > budget):
            out += _one_forward(engine, group, SamplingParams(max_tokens=1, ignore_eos=True), f"accuracy-{len(out)}")
            group = []
        if seq is not None:
            group.append(seq)
    return out


def _one_forward(engine: Any, group: list[list[int]], params: Any, prefix: str) -> list[torch.Tensor]:
    ids = [engine.add_request(list(seq), params, request_id=f"{prefix}-{i}") for i, seq in enumerate(group)]
    try:
        sched = engine.scheduler.schedule()
        lengths = [item.num_new_tokens for item in sched.scheduled]
        if lengths != [len(seq) for seq in group] or any(item.start for item in sched.scheduled):
            raise RuntimeError(f"the accuracy forward was not scheduled whole ({lengths})")
        runner = engine.runner
        inputs = runner.prepare_inputs(sched)
        with torch.inference_mode():
            hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)
            logits = runner.model.compute_logits(hidden).float().cpu()
    finally:
        for rid in ids:
            engine.abort(rid)
    return list(logits.split(lengths))


def compare(reference: Sequence[torch.Tensor], candidate: Sequence[torch.Tensor], starts: Sequence[int]) -> LeverAccuracy:
    """The candidate's logits against the reference's, at each sequence's positions from ``starts[i]`` on."""
    agree = total = 0
    largest = 0.0
    for ref, cand, start in zip(reference, candidate, starts, strict=True):
        ref, cand = ref[start:], cand[start:]
        agree += int((ref.argmax(-1) == cand.argmax(-1)).sum())
        total += ref.shape[0]
        largest = max(largest, float((ref - cand).abs().max()) if ref.numel() else 0.0)
    return LeverAccuracy(agreement=agree / total if total else 1.0, max_logit_diff=largest, num_positions=total,
                         num_prompts=len(reference),
                         method=(f"teacher-forced on the run's own greedy continuation ({NUM_TOKENS} tokens) of "
                                 f"{len(reference)} fixed prompts, before the load"))


def measure_accuracy(engines: Mapping[str, Any], run_name: str, numeric: Sequence[str], tokenizer: Any,
                     vocab_size: int) -> dict[str, LeverAccuracy]:
    """Each ``numeric`` variant's accuracy against ``engines[run_name]`` (the run's own configuration)."""
    if not numeric:
        return {}
    prompts = prompt_token_ids(tokenizer, vocab_size)
    continuations = greedy_continuations(engines[run_name], prompts)
    sequences = [p + c for p, c in zip(prompts, continuations, strict=True)]
    # NOTE: the logits at position len(prompt) - 1 predict the first continued token
    starts = [len(p) - 1 for p in prompts]
    # the last continued token predicts nothing the run produced: drop it
    sequences = [s[:-1] for s in sequences]
    reference = teacher_forced_logits(engines[run_name], sequences)
    return {name: compare(reference, teacher_forced_logits(engines[name], sequences), starts) for name in numeric}
