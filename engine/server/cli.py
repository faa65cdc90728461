"""``servescope serve``: the OpenAI-compatible HTTP server over the bundled engine or a baseline."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import ipaddress
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.flags import add_engine_args, engine_config_from_args
from engine.server.async_engine import DEFAULT_MAX_WAITING
from engine.server.engine_thread import EngineThread
from engine.server.listen import listening_socket
from engine.server.serving_engine import ServingEngine

if TYPE_CHECKING:
    from engine.weights import LoadedModel

ENGINE_KINDS = ("continuous", "naive", "static", "hf-cb")
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
                            "static (padded static batches), hf-cb (HF transformers' own continuous batching, greedy only)")
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
    serve.add_argument("--port-file", default=None,
                       help="write the port listened on here once bound (with --port 0: a free one)")
    add_engine_args(serve)
    serve.set_defaults(func=run_serve)


def build_engine(kind: str, config: EngineConfig, loaded: LoadedModel | None = None) -> ServingEngine:
    """The engine behind the server: ``continuous`` (LLMEngine) or a baseline from ``engine.baselines``."""
    if kind == "continuous":
        from engine.llm_engine import LLMEngine

        return LLMEngine(config, loaded)
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
    engine_class = {"naive": "NaiveEngine", "static": "StaticBatchEngine", "hf-cb": "HFContinuousBatchingEngine"}[kind]
    factory = getattr(baselines, engine_class, None)
    if factory is None:
        raise ValueError(f"--engine {kind}: engine.baselines has no {engine_class}")
    return factory(config)


@dataclass(frozen=True, slots=True)
class ServeHooks:
    """What a caller adds around ``serve``'s start-up, e.g. the probes of ``servescope diagnose``.

    ``before_engine`` runs with the config before the engine takes the device; ``before_serving`` with the
    engine and, for the continuous engine, the weights it was built from, before the server listens;
    ``attach`` wraps the whole time the server runs (it sees the exception, if one ends it).
    """

    before_engine: Callable[[EngineConfig], None] | None = None
    before_serving: Callable[[ServingEngine, LoadedModel | None], None] | None = None
    attach: Callable[[ServingEngine], contextlib.AbstractContextManager[Any]] | None = None


def run_serve(args: argparse.Namespace, hooks: ServeHooks | None = None) -> int:
    """Load the engine, then serve until SIGTERM/SIGINT; 0 after a clean shutdown."""
    import uvicorn

    from engine.server.app import ServerSettings, build_app

    hooks = hooks or ServeHooks()
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be >= 1, got {args.max_waiting}")
    if args.max_body_bytes is not None and args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not _is_loopback(args.host) and api_key is None:
        print(f"servescope: warning: serving on {args.host} without --api-key; anyone who can reach it can use it",
              file=sys.stderr)
    config = engine_config_from_args(args)

    def build() -> ServingEngine:
        if hooks.before_engine is not None:
            hooks.before_engine(config)
        loaded = None
        if hooks.before_serving is not None and args.engine == "continuous":
            from engine.weights import load_model

            loaded = load_model(config.model, config.torch_dtype, config.seed)
        engine = build_engine(args.engine, config, loaded)
        if hooks.before_serving is not None:
            hooks.before_serving(engine, loaded)
        return engine

    # NOTE: everything that runs the model before serving (the peaks, the weights, the engine, the step
    # calibration) runs on the thread that will step it: one OpenMP pool (see engine_thread). The
    # engine copied the weights, so the hook's reference to them ends with ``build``.
    engine_thread = EngineThread()
    engine = engine_thread.call(build)
    settings = ServerSettings(api_key=api_key, max_waiting=args.max_waiting)
    if args.max_body_bytes is not None:
        settings = dataclasses.replace(settings, max_body_bytes=args.max_body_bytes)
    app = build_app(engine, settings, engine_thread)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           lifespan="on", timeout_graceful_shutdown=args.shutdown_timeout))
    sockets = None
    if args.port_file:
        # NOTE: bound here, before uvicorn starts, so --port 0 gets a free port with no race and the
        # port file names a socket that is already listening (or about to accept, once lifespan ends).
        sockets = [listening_socket(args.host, args.port)]
        _write_atomic(Path(args.port_file), json.dumps({"port": sockets[0].getsockname()[1], "pid": os.getpid()}))
    attached = hooks.attach(engine) if hooks.attach is not None else contextlib.nullcontext()
    # NOTE: the app's lifespan has joined the engine thread before server.run() returns, so
    # whatever ``attach`` does on exit never races a step.
    with attached, _signals_end_quietly():
        server.run(sockets=sockets)
    return 0 if server.started else 1


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
