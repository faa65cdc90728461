"""``servescope serve`` with the probes attached: what ``servescope diagnose`` starts as its server process.

    python -m loadtests.run.probed_server --run-dir DIR [serve flags]

Runs ``serve``'s own start-up (:func:`engine.server.cli.run_serve`) with hooks that calibrate the
engine's steps (:mod:`probes.step_calibration`) and attach a :class:`~probes.session.ProbeSession`
to it (steps, requests, host, NVML) before it serves, serve until SIGTERM/SIGINT, and then stop
the probes, which writes the run directory's tables, ``run.json`` and ``trace.json``. It lives here, not in engine/, because the engine never imports probes/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.server.cli import ServeHooks, run_serve
from engine.server.cli import register as register_serve
from loadtests.config import LoadConfig
from loadtests.plan import build_plan
from probes.peaks import measure_peaks
from probes.run_dir import CALIBRATION_NAME, RunDirectory
from probes.step_calibration import DEFAULT_CONTEXT, calibrate, typical_prompt_step

RUN_DIR_FLAG = "--run-dir"


def build_parser() -> argparse.ArgumentParser:
    """``serve``'s own parser, plus where the run goes."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.run.probed_server")
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

    def before_serving(engine: Any, loaded: Any) -> None:
        calibrate_steps(engine, loaded, args.run_dir, workload)

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

    return ServeHooks(before_engine=before_engine, before_serving=before_serving, attach=attach)


def calibrate_steps(engine: Any, loaded: Any, run_dir: str, workload: dict[str, Any] | None) -> None:
    """Before the load: the engine's decode step on its own way and every execution lever at several batch sizes,
    on the weights it was built from (``loaded``), and the numeric levers' accuracy (or the cached calibration).

    NOTE: a failure here costs the execution verdict and the batch-size curve of the predictions,
    never the run (the server still serves); a warning says so.
    """
    from engine import LLMEngine

    if not isinstance(engine, LLMEngine) or loaded is None:
        return  # the baselines (naive, static) have neither paths nor a scheduler the replay runs
    config = engine.config
    try:
        context, prompt_step = representative_load(workload, engine)
        calibration = calibrate(loaded, config, context, prompt_step)
        RunDirectory(run_dir).save(CALIBRATION_NAME, calibration)
        how = (f"read from the cache in {calibration.load_s or 0.0:.2f} s (measured in {calibration.cost_s:.1f} s "
               f"before)" if calibration.cached else f"took {calibration.cost_s:.1f} s")
        print(f"servescope: step calibration {how}: {', '.join(calibration.forward_s)} at batch sizes "
              f"{calibration.batches}, {calibration.context}-token contexts, a {calibration.prefill_tokens}-token "
              f"prompt chunk", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - reported; the verdict then says the paths were not timed
        print(f"servescope: warning: the step calibration failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def representative_load(workload: dict[str, Any] | None, engine: Any) -> tuple[int, int | None]:
    """The context a decoding sequence of this load typically has (the median planned prompt plus half the median
    output) and the prompt tokens its steps typically compute (:func:`~probes.step_calibration.typical_prompt_step`:
    as many median prompts as sequences start together, the users or the seats, cut to the token budget);
    :data:`DEFAULT_CONTEXT` and None (the calibration's default chunk) when the load is not known here."""
    config = (workload or {}).get("config")
    if not config:
        return DEFAULT_CONTEXT, None
    try:
        known = {name: config[name] for name in LoadConfig.__dataclass_fields__ if name in config}
        plan = build_plan(LoadConfig(**known), engine.tokenizer, engine.config.max_model_len)
    except (ValueError, TypeError, OSError):
        return DEFAULT_CONTEXT, None
    prompt = statistics.median(item.num_prompt_tokens for item in plan)
    output = statistics.median(item.max_tokens for item in plan)
    seats = int(engine.config.max_num_seqs)
    # NOTE: a capacity search raises the users up to max_users; an open loop's arrivals queue for the seats
    users = (workload.get("max_users") or config.get("users")) if config.get("mode", "closed") == "closed" else None
    concurrency = min(int(users), seats) if users else seats
    budget = int(engine.config.max_num_batched_tokens or prompt)
    return max(1, round(prompt + output / 2)), typical_prompt_step(prompt, concurrency, budget)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_serve(args, probe_hooks(args))
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"servescope: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
