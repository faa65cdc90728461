"""HF transformers as the correctness oracle: a plain greedy loop over LlamaForCausalLM."""

from __future__ import annotations

import torch
import transformers

from engine.baselines.hf_model import cache_kwarg, hf_model_from, returned_cache

__all__ = ["hf_greedy", "hf_last_logits", "hf_model_from"]


@torch.inference_mode()
def hf_greedy(model: transformers.PreTrainedModel, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens from HF, one prompt at a time (no padding), with HF's own KV cache."""
    input_ids = torch.tensor([prompt_ids])
    cache_arg = cache_kwarg(model)
    past = None
    generated: list[int] = []
    for _ in range(max_new_tokens):
        out = model(input_ids=input_ids, use_cache=True, **{cache_arg: past})
        past = returned_cache(out)
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        input_ids = torch.tensor([[token]])
    return generated


@torch.inference_mode()
def hf_last_logits(model: transformers.PreTrainedModel, prompt_ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].float()
