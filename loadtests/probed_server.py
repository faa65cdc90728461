"""``servescope serve`` with the probes attached: what ``servescope diagnose`` starts as its server process.

    python -m loadtests.probed_server --run-dir DIR [serve flags]

Runs ``serve``'s own start-up (:func:`engine.server.cli.run_serve`) with hooks that attach a
:class:`~probes.session.ProbeSession` to it (steps, requests, host, NVML), serves until
SIGTERM/SIGINT, and then stops the probes, which writes the run directory's tables, ``run.json``
and ``trace.json``. It lives here, not in engine/, because the engine never imports probes/.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.server.cli import ServeHooks, run_serve
from engine.server.cli import register as register_serve
from probes.execution_paths import measure_for_run
from probes.peaks import measure_peaks
from probes.run_dir import RunDirectory

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
    return parser


def probe_hooks(args: argparse.Namespace) -> ServeHooks:
    """The probes around ``serve``: peaks measured before the engine starts, a probe session while it serves."""
    from probes.session import ProbeSession

    workload = json.loads(Path(args.workload_json).read_text()) if args.workload_json else None
    seeds = {"workload": args.workload_seed} if args.workload_seed is not None else None

    def before_engine(config: EngineConfig) -> None:
        # Peak bandwidth and FLOP/s of the serving device, measured before the load: the roofline (MBU,
        # MFU) in the report is relative to these. `diagnose` measures them before its first server starts
        # and leaves them in the run directory; a server started alone measures them before its engine.
        run_dir = RunDirectory(args.run_dir)
        peaks = run_dir.read_peaks()
        if peaks is None or config.dtype not in peaks.flops_by_dtype:
            peaks = measure_peaks(config.device, config.dtype, num_threads=config.num_threads)
        run_dir.write_peaks(peaks.for_dtype(config.dtype))

    @contextlib.contextmanager
    def attach(engine: Any) -> Iterator[None]:
        session = ProbeSession.for_engine(engine, args.run_dir, workload=workload, seeds=seeds)
        session.start()
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            session.stop(error=error)
        time_execution_paths(engine, args.run_dir)

    return ServeHooks(before_engine=before_engine, attach=attach)


def time_execution_paths(engine: Any, run_dir: str) -> None:
    """After the load: the run's execution path against the optimized one on its decode batch.

    NOTE: a failure here costs the execution evidence, never the run: the probes are written already.
    """
    config = engine.config
    try:
        measure_for_run(run_dir, config.model, config.execution, config.dtype, config.device, config.num_threads,
                        settings=dataclasses.asdict(config))
    except Exception as exc:  # noqa: BLE001 - reported, and the verdict says the paths were not timed
        print(f"servescope: warning: timing the execution paths failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_serve(args, probe_hooks(args))
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"servescope: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
