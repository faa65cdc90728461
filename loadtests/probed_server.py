"""``servescope serve`` with the probes attached: what ``servescope diagnose`` starts as its server process.

    python -m loadtests.probed_server --run-dir DIR [serve flags]

Builds the engine exactly as ``serve`` does (same flags, same builder), attaches a
:class:`~probes.session.ProbeSession` to it (steps, requests, host, NVML), serves until
SIGTERM/SIGINT, and then stops the probes, which writes the run directory's tables, ``run.json``
and ``trace.json``. It lives here, not in engine/, because the engine never imports probes/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from engine.cli import engine_config_from_args
from engine.server.cli import API_KEY_ENV, build_engine
from engine.server.cli import register as register_serve

RUN_DIR_FLAG = "--run-dir"


def build_parser() -> argparse.ArgumentParser:
    """``serve``'s own parser, plus where the run goes."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.probed_server")
    sub = parser.add_subparsers(dest="command", required=True)
    register_serve(sub)
    serve = sub.choices["serve"]
    serve.add_argument(RUN_DIR_FLAG, required=True, help="run directory the probes write")
    serve.add_argument("--workload-json", default=None,
                       help="a JSON file describing the load, recorded in run.json as the workload")
    serve.add_argument("--workload-seed", type=int, default=None, help="the load's seed, recorded in run.json")
    serve.add_argument("--port-file", default=None,
                       help="write the port listened on here once bound (use with --port 0 for a free one)")
    return parser


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from engine.server.app import ServerSettings, build_app
    from probes.session import ProbeSession

    workload = json.loads(Path(args.workload_json).read_text()) if args.workload_json else None
    seeds = {"workload": args.workload_seed} if args.workload_seed is not None else None
    from reports.roofline import measure_peaks, write_peaks

    engine_config = engine_config_from_args(args)
    # Peak bandwidth and FLOP/s of the serving device, measured before the engine takes it: the
    # roofline (MBU, MFU) in the report is relative to these.
    write_peaks(args.run_dir, measure_peaks(engine_config.device, engine_config.dtype))
    engine = build_engine(args.engine, engine_config)
    session = ProbeSession.for_engine(engine, args.run_dir, workload=workload, seeds=seeds)  # type: ignore[arg-type]
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    app = build_app(engine, ServerSettings(api_key=api_key, max_waiting=args.max_waiting))
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on",
                            timeout_graceful_shutdown=args.shutdown_timeout)
    server = uvicorn.Server(config)
    # NOTE: bound here, before uvicorn starts, so --port 0 gets a free port with no race and the
    # port file names a socket that is already listening (or about to accept, once lifespan ends).
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.create_server((args.host, args.port), family=family)
    if args.port_file:
        _write_atomic(Path(args.port_file), json.dumps({"port": sock.getsockname()[1], "pid": os.getpid()}))
    session.start()
    error: BaseException | None = None
    try:
        with _signals_end_quietly():
            server.run(sockets=[sock])
    except BaseException as exc:
        error = exc
        raise
    finally:
        # NOTE: the app's lifespan has joined the engine thread by now, so no step races the detach.
        session.stop(error=error)
    return 0 if server.started else 1


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """While uvicorn runs, SIGTERM/SIGINT mean "shut down gracefully, then return" (as ``serve`` does).

    NOTE: uvicorn re-raises the signal it caught under the handlers installed before it started;
    no-op handlers here let ``server.run()`` return, so the probes are stopped and written.
    """
    previous = {sig: signal.signal(sig, lambda signum, frame: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"servescope: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
