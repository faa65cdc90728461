"""Refuse request bodies over a size limit with a 413, before they are buffered or parsed.

A pure ASGI middleware: a declared ``Content-Length`` over the limit is refused at once, and a
chunked body is counted as it arrives, so a client cannot make the server hold more than the limit.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.server.errors import APIError

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


def _too_large(limit: int) -> str:
    return f"The request body is larger than this server accepts ({limit} bytes)"


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            error = (APIError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _too_large(limit), code="body_too_large")
                     if declared.isdigit() else
                     APIError(HTTPStatus.BAD_REQUEST, "The Content-Length header is not a number"))
            await error.to_response()(scope, receive, send)
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # NOTE: FastAPI re-raises its own HTTPException from body reading, so this
                    # reaches the app's handler and becomes an OpenAI-shaped 413.
                    raise HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _too_large(limit))
            return message

        await self.app(scope, counted_receive, send)
