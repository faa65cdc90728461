"""The engine's own commands, ``servescope generate`` and ``servescope fetch-model``, as register functions.

``servescope``'s one ``main`` (loadtests.cli) lists them beside every other command; engine/ never
imports the packages above it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from engine.flags import add_engine_args, engine_config_from_args


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


def register_generate(subparsers: Any) -> None:
    """Add ``servescope generate``: text from the bundled engine, offline."""
    gen = subparsers.add_parser("generate", help="generate text offline with the bundled engine")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_engine_args(gen)
    gen.set_defaults(func=_cmd_generate)


def register_fetch_model(subparsers: Any) -> None:
    """Add ``servescope fetch-model``: download and verify the default model."""
    fetch = subparsers.add_parser("fetch-model", help="download and verify the default model's GGUF file")
    fetch.set_defaults(func=_cmd_fetch_model)
