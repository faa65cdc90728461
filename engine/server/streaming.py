"""Server-sent events for both endpoints, and the non-streaming wait that notices a vanished client.

Either way, a request whose client goes away is aborted in the engine, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.outputs import RequestOutput
from engine.server.errors import error_body
from engine.server.logprobs import LogprobRenderer
from engine.server.request_stream import EngineUnavailableError, RequestFailedError, RequestStream
from engine.server.responses import (
    ChatCompletionChunk,
    ChatStreamChoice,
    CompletionChoice,
    CompletionResponse,
    Delta,
    Usage,
)

SSE_DONE = "data: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """A ``text/event-stream`` response that always closes its event generator.

    NOTE: Starlette cancels the body while it awaits the next event when the client disconnects,
    but a send that fails leaves the generator suspended at a ``yield``; closing it here runs its
    ``finally`` (the abort) in both cases, not whenever the garbage collector gets to it.
    """

    def __init__(self, events: AsyncIterator[str]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()


def sse(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


def sse_error(exc: Exception) -> str:
    """An error that happens after the 200 went out travels as an event, as vLLM sends it."""
    return f"data: {json.dumps(error_body(str(exc), type='server_error'))}\n\n"


@dataclass(slots=True, frozen=True)
class StreamOptions:
    """What a stream carries besides text: a final usage chunk, usage on every chunk, logprobs."""

    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: LogprobRenderer | None = None


async def completion_events(stream: RequestStream, model: str, created: int,
                            options: StreamOptions) -> AsyncIterator[str]:
    """``text_completion`` chunks: text deltas, a final chunk with ``finish_reason``, usage, ``[DONE]``."""

    def chunk(text: str, output: RequestOutput, final: bool = False) -> CompletionResponse:
        logprobs = None
        if options.logprobs is not None and not final and output.new_logprobs:
            logprobs = options.logprobs.completion(output.new_logprobs)
        choice = CompletionChoice(text=text, logprobs=logprobs,
                                  finish_reason=output.finish_reason if final else None,
                                  stop_reason=output.stop_reason if final else None)
        usage = Usage.of(output) if options.continuous_usage else None
        return CompletionResponse(id=stream.request_id, created=created, model=model, choices=[choice], usage=usage)

    try:
        final: RequestOutput | None = None
        try:
            async for output in stream:
                if output.new_text or (options.logprobs is not None and output.new_logprobs):
                    yield sse(chunk(output.new_text, output))
                final = output
        except (RequestFailedError, EngineUnavailableError) as exc:
            yield sse_error(exc)
            final = None
        if final is not None:
            yield sse(chunk("", final, final=True))
            if options.include_usage:
                yield sse(CompletionResponse(id=stream.request_id, created=created, model=model, choices=[],
                                             usage=Usage.of(final)))
        yield SSE_DONE
    finally:
        stream.cancel()


async def chat_events(stream: RequestStream, model: str, created: int, num_prompt_tokens: int,
                      options: StreamOptions) -> AsyncIterator[str]:
    """``chat.completion.chunk`` events: the assistant role, content deltas, ``finish_reason``, usage, ``[DONE]``."""

    def chunk(delta: Delta, output: RequestOutput | None, final: bool = False) -> ChatCompletionChunk:
        logprobs = None
        if options.logprobs is not None and output is not None and not final and output.new_logprobs:
            logprobs = options.logprobs.chat(output.new_logprobs)
        choice = ChatStreamChoice(delta=delta, logprobs=logprobs,
                                  finish_reason=output.finish_reason if final and output else None,
                                  stop_reason=output.stop_reason if final and output else None)
        usage = None
        if options.continuous_usage:
            usage = Usage.of(output) if output is not None else Usage(
                prompt_tokens=num_prompt_tokens, completion_tokens=0, total_tokens=num_prompt_tokens)
        return ChatCompletionChunk(id=stream.request_id, created=created, model=model, choices=[choice], usage=usage)

    try:
        yield sse(chunk(Delta(role="assistant", content=""), None))
        final: RequestOutput | None = None
        try:
            async for output in stream:
                if output.new_text or (options.logprobs is not None and output.new_logprobs):
                    yield sse(chunk(Delta(content=output.new_text), output))
                final = output
        except (RequestFailedError, EngineUnavailableError) as exc:
            yield sse_error(exc)
            final = None
        if final is not None:
            yield sse(chunk(Delta(), final, final=True))
            if options.include_usage:
                yield sse(ChatCompletionChunk(id=stream.request_id, created=created, model=model, choices=[],
                                              usage=Usage.of(final)))
        yield SSE_DONE
    finally:
        stream.cancel()


async def collect_final(stream: RequestStream, request: Request) -> RequestOutput | None:
    """Wait for the request's last output; None (and the request aborted) if the client disconnects first.

    Raises what the stream raises (RequestFailedError, EngineUnavailableError).
    """

    async def last_output() -> RequestOutput:
        final: RequestOutput | None = None
        async for output in stream:
            final = output
        assert final is not None, "a stream ends with a finished output"
        return final

    collector = asyncio.create_task(last_output())
    watcher = asyncio.create_task(_wait_for_disconnect(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if collector.done():
            return collector.result()
        return None
    finally:
        watcher.cancel()
        collector.cancel()
        stream.cancel()


async def _wait_for_disconnect(request: Request) -> None:
    # NOTE: the body has been read by now, so the next ASGI message is the disconnect (uvicorn
    # delivers it when the client closes the socket, or after the response has been sent).
    while (await request.receive())["type"] != "http.disconnect":
        pass
