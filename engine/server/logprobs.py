"""The engine's per-token log-probabilities in OpenAI's two shapes (chat and legacy completions)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.outputs import TokenLogprob
from engine.server.responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from engine.tokenizer import Tokenizer


class LogprobRenderer:
    """Names tokens as text (special tokens included) for one request's logprobs.

    ``top`` is how many alternatives the request asked for; the engine always computes what was
    asked, so this only trims (chat's ``logprobs: true`` without ``top_logprobs`` asks for none).
    A completion stream keeps ``text_offset`` running across chunks, hence one renderer per request.
    """

    def __init__(self, tokenizer: Tokenizer, top: int) -> None:
        self._tokenizer = tokenizer
        self._top = top
        self._offset = 0

    def token(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def chat(self, logprobs: Sequence[TokenLogprob]) -> ChatLogprobs:
        content = []
        for lp in logprobs:
            text = self.token(lp.token_id)
            top = [TopLogprob(token=(t := self.token(i)), logprob=v, bytes=list(t.encode("utf-8", "replace")))
                   for i, v in lp.top[:self._top]]
            content.append(ChatTokenLogprob(token=text, logprob=lp.logprob, bytes=list(text.encode("utf-8", "replace")),
                                            top_logprobs=top))
        return ChatLogprobs(content=content)

    def completion(self, logprobs: Sequence[TokenLogprob]) -> CompletionLogprobs:
        tokens: list[str] = []
        offsets: list[int] = []
        for lp in logprobs:
            text = self.token(lp.token_id)
            tokens.append(text)
            offsets.append(self._offset)
            self._offset += len(text)
        top = [{self.token(i): v for i, v in lp.top[:self._top]} for lp in logprobs] if self._top else None
        return CompletionLogprobs(tokens=tokens, token_logprobs=[lp.logprob for lp in logprobs], top_logprobs=top,
                                  text_offset=offsets)
