"""Time an OpenAI-style SSE stream line by line: first content token, every content chunk, the end.

What counts (and the tests hold these):
- the first token is the first chunk that carries text: not the chat role chunk (``content: ""``),
  not an empty keep-alive chunk, not a comment line;
- the end is the chunk that carries ``finish_reason`` (else the last content chunk): the usage
  chunk and ``[DONE]`` that follow it never move it;
- token counts come from the usage chunk when the server sends one (``stream_options``), else
  the number of content chunks stands in and ``has_usage`` is False;
- a server's own ``timings`` object (llama.cpp's, in its last chunk: ``prompt_ms``, ``predicted_ms``,
  ``predicted_n``) is kept as the server's account of the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DATA_PREFIX = "data:"
DONE = "[DONE]"


@dataclass(slots=True)
class StreamTiming:
    """What a stream said and when; times are whatever clock the caller passes to :meth:`StreamTimer.feed`."""

    request_id: str | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per content chunk
    end_time: float | None = None
    last_event_time: float | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    num_completion_tokens: int | None = None
    num_cached_tokens: int | None = None
    is_done: bool = False  # saw [DONE]
    error: str | None = None
    server_prompt_s: float | None = None  # the server's timings, when it sends them
    server_decode_s: float | None = None
    server_decode_tokens: int | None = None
    text: str = ""  # the content, kept only when asked (a chat session sends it back as history)

    @property
    def has_usage(self) -> bool:
        return self.num_completion_tokens is not None

    @property
    def num_output_tokens(self) -> int:
        """Output tokens per the usage chunk, else the count of content chunks."""
        return self.num_completion_tokens if self.num_completion_tokens is not None else len(self.token_times)


class StreamTimer:
    """Feed it each line of the response body with the time it arrived; read :attr:`timing`."""

    def __init__(self, api: str, keep_text: bool = False) -> None:
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
        self._is_chat = api == "chat"
        self._keep_text = keep_text
        self._parts: list[str] = []
        self.timing = StreamTiming()

    def feed(self, line: str, now: float) -> None:
        """One line of the body (without its newline); blank lines, comments and other fields are skipped."""
        if not line.startswith(DATA_PREFIX):
            return
        payload = line[len(DATA_PREFIX):].strip()
        timing = self.timing
        if timing.end_time is None:
            timing.last_event_time = now
        if payload == DONE:
            timing.is_done = True
            return
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            self._fail(f"a data line that is not JSON: {payload[:200]!r}")
            return
        if not isinstance(event, dict):
            self._fail(f"a data event that is not a JSON object: {payload[:200]!r}")
            return
        if "error" in event:
            error = event["error"]
            self._fail(str(error.get("message", error) if isinstance(error, dict) else error))
            return
        if timing.request_id is None and isinstance(event.get("id"), str):
            timing.request_id = event["id"]
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._read_usage(usage)
        timings = event.get("timings")
        if isinstance(timings, dict):
            self._read_timings(timings)
        for choice in event.get("choices") or []:
            content = self._content(choice)
            if content:
                if self._keep_text:
                    self._parts.append(content)
                if timing.first_token_time is None:
                    timing.first_token_time = now
                timing.token_times.append(now)
            if choice.get("finish_reason") is not None and timing.end_time is None:
                timing.finish_reason = str(choice["finish_reason"])
                timing.end_time = now

    def finish(self) -> StreamTiming:
        """The timing once the body has ended; a stream cut short without a finish is an error.

        A stream that reaches ``[DONE]`` with content but no ``finish_reason`` (llama-cpp-python's
        server sends these) is complete: it ends at its last content chunk, reason unknown.
        """
        timing = self.timing
        timing.text = "".join(self._parts)
        if timing.end_time is None:
            timing.end_time = timing.token_times[-1] if timing.token_times else timing.last_event_time
            if timing.error is None and not (timing.is_done and timing.token_times):
                timing.error = "the stream ended without a finish_reason"
        return timing

    def _content(self, choice: dict[str, Any]) -> str:
        if self._is_chat:
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            return content if isinstance(content, str) else ""
        text = choice.get("text")
        return text if isinstance(text, str) else ""

    def _read_usage(self, usage: dict[str, Any]) -> None:
        timing = self.timing
        if isinstance(usage.get("prompt_tokens"), int):
            timing.num_prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            timing.num_completion_tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            timing.num_cached_tokens = details["cached_tokens"]

    def _read_timings(self, timings: dict[str, Any]) -> None:
        timing = self.timing
        prompt_ms, predicted_ms, predicted_n = (timings.get(k) for k in ("prompt_ms", "predicted_ms", "predicted_n"))
        if isinstance(prompt_ms, int | float):
            timing.server_prompt_s = float(prompt_ms) / 1000.0
        if isinstance(predicted_ms, int | float):
            timing.server_decode_s = float(predicted_ms) / 1000.0
        if isinstance(predicted_n, int):
            timing.server_decode_tokens = predicted_n

    def _fail(self, message: str) -> None:
        if self.timing.error is None:
            self.timing.error = message
