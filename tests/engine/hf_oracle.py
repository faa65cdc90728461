"""HF transformers as the correctness oracle: a plain greedy loop over LlamaForCausalLM."""

from __future__ import annotations

import inspect

import torch
import transformers

from engine.model.config import LlamaConfig


def hf_model_from(config: LlamaConfig, state_dict: dict[str, torch.Tensor]) -> transformers.LlamaForCausalLM:
    """An HF Llama with exactly our weights (for dummy and HF-directory models)."""
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings, attn_implementation="eager",
    )
    model = transformers.LlamaForCausalLM(hf_config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.float().eval()


@torch.inference_mode()
def hf_greedy(model: transformers.PreTrainedModel, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens from HF, one prompt at a time (no padding), with HF's own KV cache."""
    input_ids = torch.tensor([prompt_ids])
    # NOTE: transformers 5 renamed the cache argument; pass it under whichever name forward takes.
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    past = None
    generated: list[int] = []
    for _ in range(max_new_tokens):
        out = model(input_ids=input_ids, use_cache=True, **{cache_arg: past})
        past = out.past_key_values
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        input_ids = torch.tensor([[token]])
    return generated


@torch.inference_mode()
def hf_last_logits(model: transformers.PreTrainedModel, prompt_ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].float()
