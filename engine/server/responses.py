"""OpenAI response bodies and stream chunks, built from the engine's :class:`RequestOutput`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, model_serializer

from engine.outputs import RequestOutput


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, output: RequestOutput) -> Usage:
        num_prompt = len(output.prompt_token_ids)
        num_completion = len(output.token_ids)
        return cls(prompt_tokens=num_prompt, completion_tokens=num_completion,
                   total_tokens=num_prompt + num_completion,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=output.num_cached_tokens))


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per output token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    """A chat stream delta; unset fields are left out, as OpenAI's chunks leave them out."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer
    def _without_none(self) -> dict[str, Any]:
        return {key: value for key, value in (("role", self.role), ("content", self.content)) if value is not None}


class ChatStreamChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "servescope"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
