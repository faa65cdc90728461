"""The ``servescope`` command line.

Engine commands live here; other packages add theirs through the ``servescope.commands``
entry-point group (a callable that takes the argparse subparsers), so engine/ never imports them.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from importlib.metadata import entry_points

from engine.flags import add_engine_args, engine_config_from_args
from engine.server.cli import register as register_serve


def _cmd_generate(args: argparse.Namespace) -> int:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(**dataclasses.asdict(engine_config_from_args(args)))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sampling_seed)
    if args.chat:
        print(llm.chat([{"role": "user", "content": args.prompt}], params)[0].text)
    else:
        print(args.prompt + llm.generate([args.prompt], params)[0].text)
    return 0


def _cmd_fetch_model(args: argparse.Namespace) -> int:
    from engine.weights.fetch import fetch_smollm2

    print(fetch_smollm2())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servescope", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text offline with the bundled engine")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_engine_args(gen)
    gen.set_defaults(func=_cmd_generate)

    fetch = sub.add_parser("fetch-model", help="download and verify the default model's GGUF file")
    fetch.set_defaults(func=_cmd_fetch_model)

    register_serve(sub)

    for entry in entry_points(group="servescope.commands"):
        entry.load()(sub)
    return parser


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
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
