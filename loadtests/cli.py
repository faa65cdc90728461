"""The ``servescope`` command line: its one :func:`main`, every command listed in :func:`build_parser`.

``load`` (any OpenAI-compatible server) and ``diagnose`` (ours, probed) are defined here and take the
same load flags; ``diagnose`` also takes the engine flags of ``serve``. The other commands come from
the package that owns them as register functions. ``python -m loadtests.cli`` is the same command
without an install.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from engine.cli import register_fetch_model, register_generate
from engine.server.cli import register as register_serve
from loadtests.bench import register as register_bench
from loadtests.client.load_context import API_KEY_ENV
from loadtests.client.worker import register_worker
from loadtests.config import DEFAULT_MAX_USERS
from loadtests.errors import RunFailedError
from loadtests.gate.cli import register_gate
from loadtests.load_flags import (
    DIAGNOSE_DEFAULTS,
    LOAD_DEFAULTS,
    add_load_args,
    add_master_args,
    configs_from_args,
    diagnose_max_users,
    is_search,
    schedule_words,
    with_master,
)
from probes.run_dir import RUNS_DIR
from reports.cli import register_compare, register_report

# What ``servescope --help`` opens with: the question the tool answers.
DESCRIPTION = ("servescope answers why an LLM inference server is not faster, and which lever fixes it: it loads the "
               "server (its bundled engine, probed, or any OpenAI-compatible one), names the bottleneck (batching, "
               "KV cache or execution) with the evidence, and predicts what each lever would buy.")

# Flags of `serve` that `diagnose` takes and hands to its server process, besides the engine flags.
SERVE_FLAGS = ("engine", "max_waiting")


def _out_dir(args: argparse.Namespace, command: str) -> Path:
    return args.out if args.out is not None else RUNS_DIR / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"


def _cmd_load(args: argparse.Namespace) -> int:
    from rich.console import Console

    from loadtests.run.orchestrator import SearchOptions, run_load

    configs, sweep = configs_from_args(args, LOAD_DEFAULTS)
    configs = with_master(configs, args)
    out = _out_dir(args, "load")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    console = Console(stderr=True)
    search = SearchOptions(args.max_users or DEFAULT_MAX_USERS, args.model_bytes) if is_search(args) else None
    try:
        run_load(configs, out, args.target, console, sweep, args.tokenizer, args.served_model, api_key, search)
    except RunFailedError as exc:
        console.print(f"servescope: error: {exc}")
        return 1
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from rich.console import Console

    from loadtests.run.orchestrator import run_diagnose

    configs, sweep = configs_from_args(args, DIAGNOSE_DEFAULTS)
    out = _out_dir(args, "diagnose")
    console = Console(stderr=True)
    points = ("a capacity search (users 1, 2, 4, ... while throughput rises)" if is_search(args)
              else ", ".join(c.point_name for c in configs))
    console.print(f"servescope diagnose: {args.model}, {configs[0].workload}, {points}, {schedule_words(configs[0])} "
                  f"-> {out}")
    try:
        if args.retest is not None:
            if sweep is not None:
                raise ValueError("--retest reruns one load point with the named lever pulled; drop --sweep")
            from loadtests.retest import run_retest
            from loadtests.run.orchestrator import SearchOptions

            search = SearchOptions(diagnose_max_users(args)) if is_search(args) else None
            run_retest(configs[0], out, serve_argv(args), args.model, console, args.retest, search=search)
            return 0
        if is_search(args):
            from loadtests.run.orchestrator import SearchOptions, run_diagnose_search

            run_diagnose_search(configs[0], out, serve_argv(args), args.model, console,
                                SearchOptions(diagnose_max_users(args)))
            return 0
        if args.ablate:
            if sweep is not None:
                raise ValueError("--ablate runs one load point per variant; drop --sweep")
            from loadtests.run.orchestrator import run_ablation

            run_ablation(configs[0], out, serve_argv(args), args.model, console)
            return 0
        run_diagnose(configs, out, serve_argv(args), args.model, console, sweep)
    except RunFailedError as exc:
        console.print(f"servescope: error: {exc}")
        return 1
    return 0


def serve_argv(args: argparse.Namespace) -> list[str]:
    """The engine and serve flags of ``args`` as a command line for the server process."""
    from engine.flags import engine_argv

    argv = engine_argv(args)
    for dest in SERVE_FLAGS:
        argv += ["--" + dest.replace("_", "-"), str(getattr(args, dest))]
    return argv


def register_load(subparsers: Any) -> None:
    """Add ``servescope load``."""
    p = subparsers.add_parser(
        "load", help="load any OpenAI-compatible server with Locust and measure it (TTFT, TPOT, goodput...)",
        description="Drive an OpenAI-compatible server (servescope, vLLM, SGLang, TGI, llama.cpp) with Locust, "
                    "headless; scrape its /metrics when it has one; write a run directory and its summary.")
    p.add_argument("--target", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--served-model", default=None, help="model name to request (default: the first /v1/models lists)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer to cut prompts with: a --model name (default: the served model's when it is one, "
                        "else smollm2-135m)")
    p.add_argument("--api-key", default=None, help="bearer token for the target (or set $SERVESCOPE_API_KEY)")
    p.add_argument("--model-bytes", type=int, default=None,
                   help="the served model's weight bytes, for the single-stream bandwidth use when the target runs "
                        "on this machine (default: known for the --model names)")
    add_load_args(p, LOAD_DEFAULTS)
    add_master_args(p)
    p.set_defaults(func=_cmd_load)


def register_diagnose(subparsers: Any) -> None:
    """Add ``servescope diagnose``."""
    from engine.flags import add_engine_args
    from engine.server.async_engine import DEFAULT_MAX_WAITING
    from engine.server.cli import ENGINE_KINDS

    p = subparsers.add_parser(
        "diagnose", help="start our server with probes, load it, and say what holds it back",
        description="Start `servescope serve` (probed) on a free loopback port, load it with Locust headless, "
                    "stop it, and write the run directory, DIR/diagnosis.json and DIR/report.html.")
    p.add_argument("--engine", choices=ENGINE_KINDS, default="continuous", help="as on `serve`")
    p.add_argument("--max-waiting", type=int, default=DEFAULT_MAX_WAITING, help="as on `serve`")
    add_engine_args(p)  # NOTE: its --seed seeds the engine and the workload alike
    add_load_args(p, DIAGNOSE_DEFAULTS, with_seed=False)
    p.add_argument("--ablate", action="store_true",
                   help="run the same load with each lever switched off in turn (batching, paged KV, optimized "
                        "execution) and the naive HF baseline, and report them side by side")
    p.add_argument("--retest", type=int, nargs="?", const=1, default=None, metavar="N",
                   help="after the diagnosis, rerun the same load with the lever predicted to gain most pulled, and "
                        "diagnose again; up to N rounds (default 1), stopping when no lever is predicted to gain 10%%; "
                        "each round in OUT/round-K (after a capacity search: its verdict's point, rerun)")
    p.set_defaults(func=_cmd_diagnose)


def build_parser() -> argparse.ArgumentParser:
    """``servescope`` and every command it has, in the order ``--help`` lists them."""
    parser = argparse.ArgumentParser(prog="servescope", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {servescope_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    register_diagnose(sub)
    register_load(sub)
    register_report(sub)
    register_compare(sub)
    register_gate(sub)
    register_serve(sub)
    register_generate(sub)
    register_bench(sub)
    register_worker(sub)
    register_fetch_model(sub)
    return parser


def servescope_version() -> str:
    """The installed distribution's version (pyproject.toml's)."""
    try:
        return version("servescope")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def ends_like_ctrl_c_on_sigterm() -> None:
    """SIGTERM raises SystemExit(143) instead of killing the process outright, so ``finally`` blocks
    and context managers run: the children a command started (Locust, a probed server) are stopped
    and the run directory is closed, as on Ctrl-C. Left alone if someone already handles SIGTERM."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command: 2 with a one-line message for bad input, 130 on Ctrl-C, 143 on SIGTERM."""
    ends_like_ctrl_c_on_sigterm()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("servescope: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"servescope: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """``servescope ...`` (pyproject's script) and ``python -m loadtests.cli ...``."""
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
