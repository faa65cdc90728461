"""OpenAI request bodies for ``/v1/completions`` and ``/v1/chat/completions``, with OpenAI's field names.

NOTE: models are strict (no "16" for 16, no true for 1) and forbid unknown fields, as OpenAI's own
API does, so a misspelt parameter is a 400 rather than silently ignored. Fields that OpenAI defines
but this engine cannot honour are accepted only at their neutral value (``n=1``, no penalties...);
:meth:`SamplingRequest.unsupported` names the first one that is not. vLLM's extensions that
benchmark clients send (GuideLLM, AIPerf, ``vllm bench serve``: ``ignore_eos``, ``min_tokens``,
``min_p``, ``skip_special_tokens``, ``stream_options.continuous_usage_stats``) are served.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine.sampling_params import MAX_LOGPROBS

# torch.Generator.manual_seed's accepted range.
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far on every chunk


class SamplingRequest(_Strict):
    """Fields both endpoints share. ``top_k``, ``min_p``, ``min_tokens``, ``ignore_eos``,
    ``stop_token_ids``, ``include_stop_str_in_output`` and ``skip_special_tokens`` are vLLM's
    extensions (pass them via ``extra_body``)."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage on every streamed chunk (vLLM sends it only with ``include_usage`` too)."""
        return self.include_usage and self.stream_options is not None and self.stream_options.continuous_usage_stats

    @property
    def num_logprobs(self) -> int | None:
        """How many top log-probabilities per token the engine computes; None: no logprobs."""
        return None

    def unsupported(self) -> tuple[str, str] | None:
        """``(param, message)`` for the first field set to something this server cannot do."""
        if self.n not in (None, 1):
            return "n", f"only n=1 is supported, got n={self.n}"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options can only be set when stream is true"
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0.0):
                return name, f"{name} is not supported (got {value}); leave it unset or 0"
        if self.repetition_penalty not in (None, 1.0):
            return "repetition_penalty", "repetition_penalty is not supported; leave it unset or 1"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        return None


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: one prompt, as text or token ids (a one-item batch is accepted)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "only best_of=1 is supported"
        return super().unsupported()


class ContentPart(BaseModel):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` can be served."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def as_template_input(self) -> dict[str, Any]:
        """The ``{"role", "content"}`` dict chat templates read; text parts are joined."""
        content: Any = self.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content)
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        return message


class ResponseFormat(_Strict):
    type: str


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``; the prompt is the model's chat template over ``messages``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    @property
    def max_new_tokens(self) -> int | None:
        """``max_completion_tokens`` (OpenAI's current name) wins over the older ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs set to true"
        for m, message in enumerate(self.messages):
            for p, part in enumerate(message.content if isinstance(message.content, list) else []):
                if part.type != "text" or part.text is None:
                    return "messages", (f"messages[{m}].content[{p}]: only text content parts "
                                        f"({{'type': 'text', 'text': ...}}) are supported, got type {part.type!r}; "
                                        f"this server serves a text-only model")
        if self.tools:
            return "tools", "tool calling is not supported"
        if self.tool_choice not in (None, "none"):
            return "tool_choice", "tool calling is not supported"
        if self.response_format is not None and self.response_format.type != "text":
            return "response_format", f"response_format {self.response_format.type!r} is not supported"
        return super().unsupported()
