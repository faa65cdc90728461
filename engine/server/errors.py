"""Errors in OpenAI's JSON shape, ``{"error": {"message", "type", "param", "code"}}``, for every failure path."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"


class ErrorResponse(JSONResponse):
    """JSON with non-ASCII escaped: an error may quote client input, lone surrogates included,
    which UTF-8 cannot encode; escaped, every message renders."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


class APIError(Exception):
    """An error the client is told about, with its HTTP status and OpenAI error fields."""

    def __init__(self, status_code: int, message: str, *, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def to_response(self) -> JSONResponse:
        return ErrorResponse(self.body(), status_code=self.status_code, headers=self.headers)


def error_body(message: str, type: str = INVALID_REQUEST, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(HTTPStatus.BAD_REQUEST, message, param=param, code=code)


def validation_error(errors: Sequence[Any]) -> APIError:
    """A 400 from pydantic's errors, naming the first offending field."""
    messages: list[str] = []
    first_param: str | None = None
    for error in errors:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        # pydantic appends the union member it tried ("str", "list[int]"); the field path is enough.
        loc = [part for part in loc if not _is_type_tag(part)]
        param = ".".join(loc) or None
        first_param = first_param or param
        if error.get("type") == "extra_forbidden":
            messages.append(f"Unrecognized request argument supplied: {param}")
        elif error.get("type") == "json_invalid":
            messages.append(f"The body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}")
        else:
            messages.append(f"{param}: {error.get('msg')}" if param else str(error.get("msg")))
    unique = list(dict.fromkeys(messages))
    return bad_request("; ".join(unique) or "invalid request", param=first_param)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error, expected or not, through the OpenAI error shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.to_response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc.errors()).to_response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        phrase = HTTPStatus(exc.status_code).phrase if exc.status_code in HTTPStatus._value2member_map_ else ""
        message = exc.detail if isinstance(exc.detail, str) else phrase
        return APIError(exc.status_code, message, code=phrase.lower().replace(" ", "_") or None,
                        headers=exc.headers).to_response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error serving %s", request.url.path)
        return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal server error: {type(exc).__name__}",
                        type="server_error").to_response()


def _is_type_tag(part: str) -> bool:
    return part in ("str", "int", "float", "bool") or part.startswith(("list[", "dict[", "function-"))
