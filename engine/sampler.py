"""Turns last-position logits into next tokens: greedy, temperature, top-k, top-p, seeds."""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask to -inf every logit outside the top-k set and the top-p nucleus (``[V]``)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # NOTE: a token is kept when the mass before it is below top_p, so the top token always stays.
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class Sampler:
    """Samples one token per row; seeded requests draw from their own generator."""

    def __init__(self, seed: int) -> None:
        self._default_generator = torch.Generator().manual_seed(seed)
        self._generators: dict[str, torch.Generator] = {}

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: list[str],
               params: list[SamplingParams]) -> list[int]:
        """logits ``[B, V]`` (float32) -> one token id per row."""
        tokens = logits.argmax(dim=-1).tolist()
        for row, (request_id, p) in enumerate(zip(request_ids, params, strict=True)):
            if p.is_greedy:
                continue
            row_logits = apply_top_k_top_p(logits[row] / p.temperature, p.top_k, p.top_p)
            probs = row_logits.softmax(-1)
            tokens[row] = int(torch.multinomial(probs, 1, generator=self._generator(request_id, p)))
        return tokens

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._default_generator
        generator = self._generators.get(request_id)
        if generator is None:
            generator = torch.Generator().manual_seed(params.seed)
            self._generators[request_id] = generator
        return generator
