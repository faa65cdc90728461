"""Turn a validated OpenAI request into what the engine takes: prompt token ids and SamplingParams.

Every check that depends on the model (context length, chat template) happens here, on the event
loop, so a bad request is answered with a 400 before it reaches the engine thread.
"""

from __future__ import annotations

from engine.sampling_params import SamplingParams
from engine.server.errors import bad_request
from engine.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from engine.tokenizer import Tokenizer

# OpenAI's defaults: 16 new tokens for a completion, the rest of the context for a chat reply,
# and temperature 1 (sampling) unless the client asks for 0 (greedy).
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 1.0


def completion_prompt_ids(body: CompletionRequest, tokenizer: Tokenizer) -> list[int]:
    """Token ids of the one prompt; text is encoded as the offline ``LLM.generate`` encodes it."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise bad_request(f"batched prompts are not supported: send one prompt per request, got {len(prompt)}",
                              param="prompt")
        prompt = prompt[0]  # type: ignore[assignment]
    ids = _encode(tokenizer, prompt, "prompt") if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise bad_request("the prompt is empty", param="prompt")
    return ids  # type: ignore[return-value]


def chat_prompt_ids(body: ChatCompletionRequest, tokenizer: Tokenizer) -> list[int]:
    """Token ids of ``messages`` rendered with the model's chat template (generation prompt added)."""
    messages = [message.as_template_input() for message in body.messages]
    try:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except ValueError as exc:
        raise bad_request(str(exc), param="messages") from exc
    ids = _encode(tokenizer, prompt, "messages")
    if not ids:
        raise bad_request("the chat template rendered an empty prompt", param="messages")
    return ids


def _encode(tokenizer: Tokenizer, text: str, param: str) -> list[int]:
    """Token ids of ``text`` as the offline ``LLM.generate`` encodes it; text the tokenizer refuses is a 400."""
    try:
        return tokenizer.encode(text, add_special_tokens=True)
    except ValueError as exc:
        raise bad_request(f"{param}: {exc}", param=param) from exc


def check_supported(body: CompletionRequest | ChatCompletionRequest) -> None:
    problem = body.unsupported()
    if problem is not None:
        param, message = problem
        raise bad_request(message, param=param)


def sampling_params(body: SamplingRequest, max_tokens: int | None, num_prompt_tokens: int, max_model_len: int,
                    default_max_tokens: int | None) -> SamplingParams:
    """The engine's SamplingParams; ``default_max_tokens=None`` means "up to the end of the context"."""
    room = max_model_len - num_prompt_tokens
    if room <= 0:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
            f"{num_prompt_tokens} tokens, which leaves no room for a completion. Please shorten the prompt.",
            param="prompt" if isinstance(body, CompletionRequest) else "messages", code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
    elif max_tokens > room:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} for the "
            f"completion). Please reduce the prompt or max_tokens.",
            param="max_tokens", code="context_length_exceeded")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
            top_k=top_k, top_p=1.0 if body.top_p is None else body.top_p,
            min_p=0.0 if body.min_p is None else body.min_p, seed=body.seed, stop=stop,
            stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
            include_stop_str_in_output=body.include_stop_str_in_output, min_tokens=body.min_tokens,
            logprobs=body.num_logprobs, skip_special_tokens=body.skip_special_tokens,
        )
    except ValueError as exc:
        message = str(exc)
        raise bad_request(message, param="min_tokens" if message.startswith("min_tokens") else None) from exc

