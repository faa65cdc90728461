"""Where a serving step's time goes, per engine configuration: decode steps at several batch sizes and
one prompt chunk, configurations interleaved round by round in one process on the same weights.

A decode step is ``engine.step()`` with every sequence decoding (contexts of ``--context`` tokens);
the prompt chunk is one ``--prefill``-token prompt alone in its step. Run it under the exclusive lock::

    flock /tmp/ss-cpu.lock python -m studies.step_shapes --rounds 3 --batches 1,8,16 \\
        --engine "--attention-backend torch" --engine "" --engine "--dtype bfloat16" \\
        --engine "--dtype bfloat16 --weights int4"

Prints the median milliseconds per decode step per batch size and per prompt chunk, per configuration.
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import time

import torch

from engine import LLMEngine, SamplingParams
from engine.flags import add_engine_args, engine_config_from_args
from engine.weights import load_model


def _decode_step_s(engine: LLMEngine, batch: int, context: int, steps: int, rng: random.Random) -> float:
    """Median seconds of ``steps`` decode steps with ``batch`` sequences of ``context`` tokens running."""
    for _ in range(batch):
        engine.add_request([rng.randrange(engine.model_config.vocab_size) for _ in range(context)],
                           SamplingParams(max_tokens=steps + 4, ignore_eos=True))
    while engine.scheduler.num_waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                                              for r in engine.scheduler.running):
        engine.step()
    engine.step()  # the first all-decode step
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    while engine.has_unfinished():
        engine.step()
    return statistics.median(times)


def _prefill_s(engine: LLMEngine, tokens: int, rng: random.Random) -> float:
    engine.add_request([rng.randrange(engine.model_config.vocab_size) for _ in range(tokens)], SamplingParams(max_tokens=1))
    start = time.perf_counter()
    engine.step()
    elapsed = time.perf_counter() - start
    while engine.has_unfinished():
        engine.step()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", default=[], help="engine flags of one configuration")
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    specs = args.engine or [""]
    engines: dict[str, LLMEngine] = {}
    loaded_by_dtype = {}
    for spec in specs:
        engine_parser = argparse.ArgumentParser()
        add_engine_args(engine_parser)
        config = engine_config_from_args(engine_parser.parse_args(["--model", args.model, *shlex.split(spec)]))
        config.enable_prefix_caching = False  # random prompts; every configuration computes every token
        if config.dtype not in loaded_by_dtype:
            loaded_by_dtype[config.dtype] = load_model(config.model, config.torch_dtype, config.seed)
        engines[spec or "(defaults)"] = LLMEngine(config, loaded_by_dtype[config.dtype])
    results: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
    rng = random.Random(0)
    for engine in engines.values():  # warm-up: every shape once, untimed
        for batch in batches:
            _decode_step_s(engine, batch, args.context, 2, rng)
        _prefill_s(engine, args.prefill, rng)
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for name in order:
            engine = engines[name]
            for batch in batches:
                results[name].setdefault(f"decode x{batch}", []).append(
                    _decode_step_s(engine, batch, args.context, args.steps, rng))
            results[name].setdefault(f"prefill {args.prefill}", []).append(_prefill_s(engine, args.prefill, rng))
    columns = [f"decode x{b}" for b in batches] + [f"prefill {args.prefill}"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per step (median of {args.rounds} "
          f"rounds; decode: context {args.context} tokens, median of {args.steps} steps)")
    print("| configuration | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in engines:
        cells = [f"{statistics.median(results[name][c]) * 1e3:.1f}" for c in columns]
        print(f"| {name} (attention: {engines[name].runner.ops.name}) | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
