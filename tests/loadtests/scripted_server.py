"""A real HTTP server (uvicorn, Starlette) that streams a fixed, slow OpenAI-style SSE script per request.

It plays the part of an external server whose stream timing the test knows exactly: it records,
per response, when it wrote the role chunk, the first content chunk, the finish chunk and the
usage chunk, so a test can check what the client measured against what was sent, and when.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.server.listen import listening_socket

MODEL = "scripted"
ROLE_TO_CONTENT_S = 0.3  # role chunk, then an empty chunk, then the first text this much later
FINISH_TO_USAGE_S = 0.4  # the usage chunk comes this long after the finish chunk
CONTENT = ["Hel", "lo", "!"]


@dataclass
class Sent:
    """When the server wrote each marked chunk of one response (time.time())."""

    role: float | None = None
    first_content: float | None = None
    content: list[float] = field(default_factory=list)  # every content chunk, in order
    finish: float | None = None
    usage: float | None = None


@dataclass(frozen=True)
class Misbehaviour:
    """How the scripted server departs from a healthy one (the servers users meet do each of these)."""

    reject_fields: tuple[str, ...] = ()  # 422 naming the field, as transformers serve answers ignore_eos
    fail_after: int | None = None  # requests answered normally; every later one gets 500
    die_after: int | None = None  # requests answered normally; then the server stops listening
    html: bool = False  # every route answers an HTML page
    cut_mid_stream: bool = False  # the stream stops after its first token, with no finish or [DONE]


@dataclass
class ScriptedServer:
    url: str
    sent: dict[str, Sent] = field(default_factory=dict)
    misbehaviour: Misbehaviour = field(default_factory=Misbehaviour)
    num_requests: int = 0
    chunk_gap_s: float = 0.02  # the pause after each content chunk
    stop: Callable[[], None] = lambda: None


def _chunk(request_id: str, is_chat: bool, text: str | None, finish: str | None = None,
           role: bool = False) -> str:
    if is_chat:
        delta: dict[str, object] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        choice: dict[str, object] = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
    return f"data: {json.dumps({'id': request_id, 'choices': [choice]})}\n\n"


def _app(server: ScriptedServer) -> Starlette:
    bad = server.misbehaviour

    async def models(request: Request) -> Response:
        if bad.html:
            return HTMLResponse("<html><body><h1>Welcome to nginx!</h1></body></html>")
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 2048}]})

    async def stream(request: Request) -> Response:
        if bad.html:
            return HTMLResponse("<html><body>Not Found</body></html>", status_code=404)
        body = await request.json()
        server.num_requests += 1
        refused = [name for name in bad.reject_fields if name in body]
        if refused:
            return JSONResponse({"detail": f"Unexpected fields in the request: {set(refused)}"}, status_code=422)
        if bad.die_after is not None and server.num_requests > bad.die_after:
            server.stop()
            return JSONResponse({"error": "shutting down"}, status_code=503)
        if bad.fail_after is not None and server.num_requests > bad.fail_after:
            return JSONResponse({"error": {"message": "internal error: the model crashed"}}, status_code=500)
        is_chat = request.url.path.endswith("/chat/completions")
        request_id = f"scripted-{uuid.uuid4().hex}"
        sent = server.sent[request_id] = Sent()

        async def events() -> AsyncIterator[str]:
            if is_chat:
                sent.role = time.time()
                yield _chunk(request_id, True, None, role=True)
            await asyncio.sleep(ROLE_TO_CONTENT_S / 2)
            yield _chunk(request_id, is_chat, "")  # an empty chunk is not a token either
            yield ": keep-alive\n\n"
            await asyncio.sleep(ROLE_TO_CONTENT_S / 2)
            for i, text in enumerate(CONTENT[: body["max_tokens"]]):
                sent.content.append(time.time())
                if i == 0:
                    sent.first_content = sent.content[0]
                yield _chunk(request_id, is_chat, text)
                if bad.cut_mid_stream:
                    return
                await asyncio.sleep(server.chunk_gap_s)
            sent.finish = time.time()
            yield _chunk(request_id, is_chat, None, finish="length")
            await asyncio.sleep(FINISH_TO_USAGE_S)
            sent.usage = time.time()
            usage = {"prompt_tokens": 5, "completion_tokens": len(CONTENT), "total_tokens": 5 + len(CONTENT)}
            yield f"data: {json.dumps({'id': request_id, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", stream, methods=["POST"]),
                             Route("/v1/chat/completions", stream, methods=["POST"])])


@contextmanager
def scripted_server(misbehaviour: Misbehaviour | None = None, chunk_gap_s: float = 0.02) -> Iterator[ScriptedServer]:
    """The scripted server on a free 127.0.0.1 port, on a background thread."""
    sock = listening_socket("127.0.0.1", 0)
    server = ScriptedServer(f"http://127.0.0.1:{sock.getsockname()[1]}", misbehaviour=misbehaviour or Misbehaviour(),
                            chunk_gap_s=chunk_gap_s)
    uv = uvicorn.Server(uvicorn.Config(_app(server), log_level="warning", lifespan="off"))

    def stop() -> None:
        uv.should_exit = True  # NOTE: uvicorn closes its listener: connections are refused, as by a dead server

    server.stop = stop
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the scripted server did not start")
        time.sleep(0.05)
    try:
        yield server
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        sock.close()
