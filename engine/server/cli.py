"""``servescope serve``: the OpenAI-compatible HTTP server over the bundled engine or a baseline."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import ipaddress
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from engine.cli import add_engine_args, engine_config_from_args
from engine.config import EngineConfig
from engine.server.async_engine import DEFAULT_MAX_WAITING
from engine.server.serving_engine import ServingEngine

ENGINE_KINDS = ("continuous", "naive", "static")
API_KEY_ENV = "SERVESCOPE_API_KEY"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def register(subparsers: Any) -> None:
    """Add the ``serve`` command to ``servescope``'s argparse subparsers."""
    serve = subparsers.add_parser(
        "serve", help="serve the OpenAI API (completions, chat, streaming, /metrics) over HTTP",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics.",
    )
    serve.add_argument("--engine", choices=ENGINE_KINDS, default="continuous",
                       help="continuous batching (default) or a baseline: naive (one request at a time), "
                            "static (padded static batches)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-waiting", type=int, default=DEFAULT_MAX_WAITING,
                       help="requests admitted but not yet running, past which new ones get 429 with Retry-After")
    serve.add_argument("--max-body-bytes", type=int, default=None,
                       help="request bodies over this many bytes get 413 before they are read (default 4 MiB)")
    serve.add_argument("--api-key", default=None,
                       help=f"require 'Authorization: Bearer KEY' on /v1 routes (or set ${API_KEY_ENV})")
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="seconds in-flight requests get to finish after SIGTERM/SIGINT before they are aborted")
    serve.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    add_engine_args(serve)
    serve.set_defaults(func=run_serve)


def build_engine(kind: str, config: EngineConfig) -> ServingEngine:
    """The engine behind the server: ``continuous`` (LLMEngine) or a baseline from ``engine.baselines``."""
    if kind == "continuous":
        from engine.llm_engine import LLMEngine

        return LLMEngine(config)
    if kind not in ENGINE_KINDS:
        raise ValueError(f"unknown engine {kind!r}; expected one of {ENGINE_KINDS}")
    # NOTE: imported only when asked for: the baselines pull in HF transformers.
    try:
        baselines = importlib.import_module("engine.baselines")
    except ModuleNotFoundError as exc:
        if exc.name == "engine.baselines":
            raise ValueError(f"--engine {kind} needs the baseline engines (engine.baselines), which this install "
                             f"does not have; use --engine continuous") from exc
        raise ValueError(f"--engine {kind} needs the {exc.name!r} package (the baselines run on HF "
                         f"transformers); install it or use --engine continuous") from exc
    engine_class = {"naive": "NaiveEngine", "static": "StaticBatchEngine"}[kind]
    factory = getattr(baselines, engine_class, None)
    if factory is None:
        raise ValueError(f"--engine {kind}: engine.baselines has no {engine_class}")
    return factory(config)


def run_serve(args: argparse.Namespace) -> int:
    """Load the engine, then serve until SIGTERM/SIGINT; 0 after a clean shutdown."""
    import uvicorn

    from engine.server.app import ServerSettings, build_app

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be >= 1, got {args.max_waiting}")
    if args.max_body_bytes is not None and args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not _is_loopback(args.host) and api_key is None:
        print(f"servescope: warning: serving on {args.host} without --api-key; anyone who can reach it can use it",
              file=sys.stderr)
    engine = build_engine(args.engine, engine_config_from_args(args))
    settings = ServerSettings(api_key=api_key, max_waiting=args.max_waiting)
    if args.max_body_bytes is not None:
        settings = dataclasses.replace(settings, max_body_bytes=args.max_body_bytes)
    app = build_app(engine, settings)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on",
                            timeout_graceful_shutdown=args.shutdown_timeout)
    server = uvicorn.Server(config)
    with _signals_end_quietly():
        server.run()
    return 0 if server.started else 1


@contextlib.contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """While uvicorn runs, SIGTERM/SIGINT mean "shut down gracefully, then return".

    NOTE: uvicorn handles both signals itself, then re-raises the one it caught under the handlers
    that were installed before it started; with Python's defaults that kills the process (SIGTERM)
    or raises KeyboardInterrupt (SIGINT) after a clean shutdown. No-op handlers here let it return.
    """
    previous = {sig: signal.signal(sig, _ignore_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ignore_signal(signum: int, frame: object) -> None:
    pass


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
