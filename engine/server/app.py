"""The FastAPI app: OpenAI routes, health, Prometheus metrics, API-key check and engine lifecycle."""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.server.async_engine import DEFAULT_MAX_WAITING, AsyncEngine, QueueFullError
from engine.server.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from engine.server.engine_thread import EngineThread
from engine.server.errors import APIError, bad_request, install_error_handlers
from engine.server.inputs import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    chat_prompt_ids,
    check_supported,
    completion_prompt_ids,
    sampling_params,
)
from engine.server.logprobs import LogprobRenderer
from engine.server.protocol import ChatCompletionRequest, CompletionRequest
from engine.server.request_stream import EngineUnavailableError, RequestFailedError, RequestStream
from engine.server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    ModelCard,
    ModelList,
    Usage,
)
from engine.server.serving_engine import ServingEngine
from engine.server.streaming import SSEResponse, StreamOptions, chat_events, collect_final, completion_events

# nginx's "client closed request": the status a request gets when nobody is left to read it.
CLIENT_CLOSED_REQUEST = 499
RETRY_AFTER_UNAVAILABLE_S = 5


@dataclass(slots=True, frozen=True)
class ServerSettings:
    """Server knobs beside the engine's own config."""

    api_key: str | None = None
    max_waiting: int = DEFAULT_MAX_WAITING
    engine_stop_timeout_s: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def build_app(engine: ServingEngine, settings: ServerSettings | None = None,
              engine_thread: EngineThread | None = None) -> FastAPI:
    """An app serving ``engine``; the engine thread starts and stops with the app's lifespan.

    ``engine_thread``: the thread that built ``engine``, which then steps it too.
    """
    settings = settings or ServerSettings()
    async_engine = AsyncEngine(engine, settings.max_waiting, engine_thread)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        try:
            yield
        finally:
            await async_engine.stop(settings.engine_stop_timeout_s)

    app = FastAPI(title="servescope", summary="OpenAI-compatible server for servescope's engine",
                  lifespan=lifespan)
    app.state.async_engine = async_engine
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.include_router(_ops_router(async_engine))
    auth = [Depends(_api_key_checker(settings.api_key))] if settings.api_key else []
    app.include_router(_openai_router(async_engine), prefix="/v1", dependencies=auth)
    return app


def _ops_router(async_engine: AsyncEngine) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> JSONResponse:
        if async_engine.is_alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=HTTPStatus.SERVICE_UNAVAILABLE)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(async_engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router


def _openai_router(async_engine: AsyncEngine) -> APIRouter:
    router = APIRouter()
    engine = async_engine.engine
    max_model_len: int = engine.config.max_model_len  # type: ignore[assignment]
    served_names = list(dict.fromkeys([engine.model_name, engine.config.model]))
    started = int(time.time())

    def check_model(name: str) -> str:
        if name not in served_names:
            raise APIError(HTTPStatus.NOT_FOUND, f"The model `{name}` does not exist. Served: {served_names}",
                           param="model", code="model_not_found")
        return name

    @router.get("/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, created=started, root=engine.model_name,
                                         max_model_len=max_model_len) for name in served_names])

    @router.post("/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        model = check_model(body.model)
        check_supported(body)
        prompt_ids = completion_prompt_ids(body, engine.tokenizer)
        params = sampling_params(body, body.max_tokens, len(prompt_ids), max_model_len,
                                 DEFAULT_COMPLETION_MAX_TOKENS)
        stream = await _submit(async_engine, prompt_ids, params, f"cmpl-{uuid.uuid4().hex}")
        created = int(time.time())
        renderer = _renderer(body.num_logprobs)
        if body.stream:
            return SSEResponse(completion_events(stream, model, created, _stream_options(body, renderer)))
        final = await _collect(stream, request)
        if final is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        logprobs = renderer.completion(final.logprobs or []) if renderer is not None else None
        choice = CompletionChoice(text=final.text, logprobs=logprobs, finish_reason=final.finish_reason,
                                  stop_reason=final.stop_reason)
        return JSONResponse(CompletionResponse(id=stream.request_id, created=created, model=model, choices=[choice],
                                               usage=Usage.of(final)).model_dump())

    @router.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        model = check_model(body.model)
        check_supported(body)
        prompt_ids = chat_prompt_ids(body, engine.tokenizer)
        params = sampling_params(body, body.max_new_tokens, len(prompt_ids), max_model_len, None)
        stream = await _submit(async_engine, prompt_ids, params, f"chatcmpl-{uuid.uuid4().hex}")
        created = int(time.time())
        renderer = _renderer(body.num_logprobs)
        if body.stream:
            return SSEResponse(chat_events(stream, model, created, len(prompt_ids), _stream_options(body, renderer)))
        final = await _collect(stream, request)
        if final is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        logprobs = renderer.chat(final.logprobs or []) if renderer is not None else None
        choice = ChatChoice(message=AssistantMessage(content=final.text), logprobs=logprobs,
                            finish_reason=final.finish_reason, stop_reason=final.stop_reason)
        return JSONResponse(ChatCompletionResponse(id=stream.request_id, created=created, model=model,
                                                   choices=[choice], usage=Usage.of(final)).model_dump())

    def _renderer(num_logprobs: int | None) -> LogprobRenderer | None:
        return None if num_logprobs is None else LogprobRenderer(engine.tokenizer, num_logprobs)

    return router


def _stream_options(body: CompletionRequest | ChatCompletionRequest, renderer: LogprobRenderer | None) -> StreamOptions:
    return StreamOptions(include_usage=body.include_usage, continuous_usage=body.continuous_usage, logprobs=renderer)


async def _submit(async_engine: AsyncEngine, prompt_ids: list[int], params: SamplingParams,
                  request_id: str) -> RequestStream:
    """Hand the request to the engine, turning refusals into their HTTP errors."""
    try:
        return await async_engine.generate(prompt_ids, params, request_id)
    except QueueFullError as exc:
        raise APIError(HTTPStatus.TOO_MANY_REQUESTS, str(exc), type="rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(exc.retry_after_s)}) from exc
    except EngineUnavailableError as exc:
        raise _unavailable(exc) from exc
    except ValueError as exc:
        raise bad_request(str(exc), param="prompt") from exc


async def _collect(stream: RequestStream, request: Request) -> RequestOutput | None:
    try:
        return await collect_final(stream, request)
    except RequestFailedError as exc:
        raise APIError(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc), type="server_error") from exc
    except EngineUnavailableError as exc:
        raise _unavailable(exc) from exc


def _unavailable(exc: Exception) -> APIError:
    return APIError(HTTPStatus.SERVICE_UNAVAILABLE, str(exc), type="server_error", code="unavailable",
                    headers={"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)})


def _api_key_checker(api_key: str) -> Callable[[Request], Awaitable[None]]:
    expected = hashlib.sha256(api_key.encode()).digest()

    async def check_api_key(request: Request) -> None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # NOTE: compare_digest over fixed-length digests takes the same time wherever the keys
        # differ and whatever their lengths: no timing oracle for the key or its length.
        offered = hashlib.sha256(token.strip().encode()).digest()
        if scheme.lower() != "bearer" or not hmac.compare_digest(offered, expected):
            raise APIError(HTTPStatus.UNAUTHORIZED,
                           "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    return check_api_key
