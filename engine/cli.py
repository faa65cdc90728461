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

from engine.config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Engine flags, the same on every command that starts an engine."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="smollm2-135m",
                   help="smollm2-135m (default), dummy:tiny, dummy:smollm2-shape, a .gguf file or an HF directory")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-num-seqs", type=int, default=16)
    g.add_argument("--max-num-batched-tokens", type=int, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--block-size", type=int, default=16)
    kv = g.add_mutually_exclusive_group()
    kv.add_argument("--kv-cache-mb", type=float, default=None)
    kv.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--kv-layout", default="paged", choices=["paged", "contiguous"])
    g.add_argument("--execution", default="optimized", choices=["eager", "optimized"])
    g.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument("--num-threads", type=int, default=None)
    g.add_argument("--host-overhead-ms", type=float, default=0.0,
                   help="calibration knob: burn this many ms of host time in every engine step")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model, dtype=args.dtype, seed=args.seed, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        block_size=args.block_size, kv_cache_mb=args.kv_cache_mb, num_kv_blocks=args.num_kv_blocks,
        kv_layout=args.kv_layout, execution=args.execution, enable_prefix_caching=not args.no_prefix_caching,
        enable_chunked_prefill=not args.no_chunked_prefill, num_threads=args.num_threads,
        host_overhead_ms=args.host_overhead_ms, device=args.device, attention_backend=args.attention_backend,
    )


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

    from engine.server.cli import register as register_serve  # here, not at the top: it imports this module

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
