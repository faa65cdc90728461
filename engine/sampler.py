"""Turns last-position logits into next tokens: greedy, temperature, min-p, top-k, top-p, seeds, logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.outputs import TokenLogprob
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


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Mask to -inf every token less likely than ``min_p`` times the most likely one (``[V]``)."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


# Tokens per chunk of the two-level draw (:func:`draw`).
DRAW_CHUNK = 1024


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``probs`` (``[V]``, non-negative): the cumulative sum inverted at one uniform draw, in two
    levels: the chunks' sums find the chunk of ``DRAW_CHUNK`` tokens the draw falls in, that chunk's own
    cumulative sum the token. Sums are float64, so a token's share of the total keeps its width.

    NOTE: ``torch.multinomial`` on CPU takes about 1.07 ms for a 49,152-token vocabulary (2-core EPYC,
    2026-12-06), as long as the 135M model's whole one-row decode on its int4 path, and a batch pays it per
    row; one cumulative sum over the vocabulary 0.07 ms (a sequential scan); the two levels read the row once
    in a vectorized sum and scan 48 chunk sums and one chunk. A token of zero probability has no width in
    either sum and is never drawn.
    """
    vocab = probs.shape[-1]
    pad = -vocab % DRAW_CHUNK
    chunks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).reshape(-1, DRAW_CHUNK)
    chunk_sums = chunks.sum(-1, dtype=torch.float64)
    chunk_cdf = chunk_sums.cumsum(-1)
    point = torch.rand(1, generator=generator, dtype=torch.float64) * chunk_cdf[-1]
    chunk = int(torch.searchsorted(chunk_cdf, point, right=True))
    if chunk >= len(chunk_cdf):  # the draw rounded onto the total: the last chunk with any probability
        chunk = int(torch.nonzero(chunk_sums).max())
    inside = point - chunk_cdf[chunk - 1] if chunk else point
    token = int(torch.searchsorted(chunks[chunk].cumsum(-1, dtype=torch.float64), inside, right=True))
    if token >= DRAW_CHUNK or chunk * DRAW_CHUNK + token >= vocab:
        # the draw rounded onto the chunk's end (its sum and its scan round apart): its last token with any probability
        token = int(torch.nonzero(chunks[chunk]).max())
    return chunk * DRAW_CHUNK + token


@dataclass(slots=True)
class SamplerOutput:
    """One token per row, and its log-probabilities where the row's request asked for them."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


def _argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first of equal maxima; a NaN counts as the maximum, as torch's does).

    NOTE: numpy's for float32 on the CPU: torch's CPU argmax over one 49,152-token row took 52 us, numpy's 5
    (2-core EPYC, 2026-12-07), 1% of a one-row decode step of SmolLM2-135M."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu":
        return logits.numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


class Sampler:
    """Samples one token per row; seeded requests draw from their own generator.

    ``eos_token_ids`` are the ids masked out (with each request's ``stop_token_ids``) while a
    request has fewer than ``min_tokens`` output tokens.
    """

    def __init__(self, seed: int, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self._default_generator = torch.Generator().manual_seed(seed)
        self._generators: dict[str, torch.Generator] = {}
        self.eos_token_ids = eos_token_ids

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: Sequence[str], params: Sequence[SamplingParams],
               num_output_tokens: Sequence[int] | None = None) -> SamplerOutput:
        """logits ``[B, V]`` (float32) -> one token per row; ``num_output_tokens`` (per row) drives min_tokens."""
        raw = logits
        logits = self._mask_early_stops(logits, params, num_output_tokens)
        # NOTE: the argmax only where a row is greedy: over a 49,152-token vocabulary it costs a sampled
        # one-row decode step tens of microseconds for nothing
        greedy = [row for row, p in enumerate(params) if p.is_greedy]
        tokens = [0] * len(params)
        if len(greedy) == len(params):
            tokens = _argmax_rows(logits)
        elif greedy:
            for row, token in zip(greedy, _argmax_rows(logits[greedy]), strict=True):
                tokens[row] = token
        for row, (request_id, p) in enumerate(zip(request_ids, params, strict=True)):
            if p.is_greedy:
                continue
            row_logits = apply_min_p(logits[row] / p.temperature, p.min_p)
            row_logits = apply_top_k_top_p(row_logits, p.top_k, p.top_p)
            tokens[row] = draw(row_logits.softmax(-1), self._generator(request_id, p))
        return SamplerOutput(tokens, self._logprobs(raw, tokens, params))

    def _mask_early_stops(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                          num_output_tokens: Sequence[int] | None) -> torch.Tensor:
        """Logits with EOS and stop ids at -inf in rows still short of their ``min_tokens``."""
        if num_output_tokens is None:
            return logits
        rows = [(row, p) for row, (p, n) in enumerate(zip(params, num_output_tokens, strict=True))
                if n < p.min_tokens]
        if not rows:
            return logits
        logits = logits.clone()
        for row, p in rows:
            banned = [t for t in {*self.eos_token_ids, *p.stop_token_ids} if t < logits.shape[-1]]
            logits[row, banned] = float("-inf")
        return logits

    @staticmethod
    def _logprobs(logits: torch.Tensor, tokens: list[int], params: Sequence[SamplingParams]
                  ) -> list[TokenLogprob | None]:
        out: list[TokenLogprob | None] = [None] * len(tokens)
        rows = [row for row, p in enumerate(params) if p.logprobs is not None]
        if not rows:
            return out
        logprobs = torch.log_softmax(logits[rows].float(), dim=-1)  # [R, V]
        for i, row in enumerate(rows):
            k = params[row].logprobs or 0
            top: tuple[tuple[int, float], ...] = ()
            if k:
                values, ids = torch.topk(logprobs[i], k)
                top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
            out[row] = TokenLogprob(tokens[row], float(logprobs[i, tokens[row]]), top)
        return out

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._default_generator
        generator = self._generators.get(request_id)
        if generator is None:
            generator = torch.Generator().manual_seed(params.seed)
            self._generators[request_id] = generator
        return generator
