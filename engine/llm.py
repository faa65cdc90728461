"""Offline batch generation, the ``vllm.LLM`` shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer
    from engine.weights import LoadedModel

Prompt = str | list[int]


class LLM:
    """``LLM(model="smollm2-135m", **engine_config).generate(prompts, params)``.

    All prompts are queued at once, so they batch; outputs come back in prompt order.
    """

    def __init__(self, model: str = "smollm2-135m", *, loaded: LoadedModel | None = None,
                 **engine_config: Any) -> None:
        """``loaded`` reuses weights already in memory (they are copied, not shared)."""
        self.engine = LLMEngine(EngineConfig(model=model, **engine_config), loaded)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        request_ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        final: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for output in self.engine.step():
                if output.finished:
                    final[output.request_id] = output
        return [final[rid] for rid in request_ids]

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Render each conversation with the model's chat template, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(conv, add_generation_prompt=True)  # type: ignore[arg-type]
                   for conv in conversations]
        return self.generate(prompts, sampling_params)
