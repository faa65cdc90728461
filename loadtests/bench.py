"""`servescope bench`: the same seeded workload through each engine and lever, side by side, in one process."""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from loadtests.workloads.catalog import WORKLOADS, WorkItem, make_workload
from reports.whole_table import print_whole

if TYPE_CHECKING:
    from engine import EngineConfig, StepStats
    from engine.weights import LoadedModel

# NOTE: the engine (torch) and the HF baselines (transformers) are imported where an engine is built, not
# here: ``servescope`` imports this module to list its commands, and those imports take seconds.

# Each bench engine: how to build it from the shared config and the weights already in memory.
EngineFactory = Callable[["EngineConfig", "LoadedModel"], object]


def _ours(config: EngineConfig, loaded: LoadedModel, /, **changes: Any) -> object:
    """The bundled engine with ``changes`` to the shared config (``weights`` among them: positional-only here)."""
    from engine.llm_engine import LLMEngine

    return LLMEngine(replace(config, **changes), loaded)


ENGINES: Mapping[str, EngineFactory] = MappingProxyType({
    "continuous": lambda c, w: _ours(c, w),
    "no-batching": lambda c, w: _ours(c, w, max_num_seqs=1),
    "contiguous": lambda c, w: _ours(c, w, kv_layout="contiguous"),
    "eager": lambda c, w: _ours(c, w, execution="eager"),
    # the optimized path with torch's decode attention (gathered, padded) instead of the CPU's C kernel
    "torch-attention": lambda c, w: _ours(c, w, attention_backend="torch"),
    "no-prefix-caching": lambda c, w: _ours(c, w, enable_prefix_caching=False),
    # NOTE: torch's int8/int4 CPU kernels are fast with bfloat16 activations only (docs/engine.md, "Which
    # `--dtype` and `--weights`"), so these use them where the CPU has native bfloat16 GEMMs.
    "int8": lambda c, w: _ours(c, w, weights="int8", dtype=_quantized_dtype(c)),
    "int4": lambda c, w: _ours(c, w, weights="int4", dtype=_quantized_dtype(c)),
    "naive": lambda c, w: _baselines().NaiveEngine(c, w),
    "static": lambda c, w: _baselines().StaticBatchEngine(c, w),
    "hf-cb": lambda c, w: _baselines().HFContinuousBatchingEngine(c, w),
})
# The raw-framework baselines every engine's throughput is divided by, when they ran: HF one request at
# a time, HF padded static batches, and HF's own continuous batching (its paged-attention manager).
BASELINES = ("naive", "static", "hf-cb")


def _baselines() -> Any:
    """The HF baselines, imported when one is built: transformers takes seconds to import, and ``servescope``
    imports this module to list its commands."""
    import engine.baselines

    return engine.baselines


def _quantized_dtype(config: EngineConfig) -> str:
    from engine.model.projection import native_bf16_gemm

    return "bfloat16" if native_bf16_gemm() is not None else config.dtype


@dataclass(slots=True)
class BenchResult:
    """What one engine did with the workload."""

    engine: str
    num_requests: int
    num_output_tokens: int
    elapsed_s: float
    output_tokens_per_s: float
    requests_per_s: float
    num_steps: int
    mean_batch_size: float
    peak_concurrent_seqs: int
    kv_waste_fraction: float
    num_preemptions: int


class _StepRecorder:
    def __init__(self) -> None:
        self.steps: list[StepStats] = []

    def on_step(self, stats: StepStats) -> None:
        self.steps.append(stats)

    def on_request_event(self, event: object) -> None:
        pass


def run_closed_loop(name: str, engine, items: list[WorkItem], concurrency: int) -> BenchResult:
    """Keep ``concurrency`` requests in flight until every item is done (like C closed-loop users)."""
    from engine.sampling_params import SamplingParams

    recorder = _StepRecorder()
    engine.add_observer(recorder)
    pending = deque(items)
    in_flight = 0
    num_output = 0
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        while pending and in_flight < concurrency:
            item = pending.popleft()
            engine.add_request(item.prompt_token_ids, SamplingParams(max_tokens=item.max_tokens, ignore_eos=True))
            in_flight += 1
        for out in engine.step():
            if out.finished:
                in_flight -= 1
                num_output += len(out.token_ids)
    elapsed = time.perf_counter() - start
    engine.remove_observer(recorder)
    steps = recorder.steps
    allocated = sum(s.num_kv_slots_allocated for s in steps)
    wasted = sum(s.num_kv_slots_allocated - s.num_kv_slots_used for s in steps)
    return BenchResult(
        engine=name, num_requests=len(items), num_output_tokens=num_output, elapsed_s=elapsed,
        output_tokens_per_s=num_output / elapsed, requests_per_s=len(items) / elapsed, num_steps=len(steps),
        mean_batch_size=sum(s.num_seqs for s in steps) / max(len(steps), 1),
        peak_concurrent_seqs=max((s.num_seqs for s in steps), default=0),
        kv_waste_fraction=wasted / allocated if allocated else 0.0,
        num_preemptions=sum(s.num_preemptions for s in steps),
    )


def run_bench(config: EngineConfig, engine_names: list[str], workload: str, num_prompts: int, concurrency: int,
              max_tokens: int | None, seed: int, rounds: int = 1, warmup: bool = True) -> dict[str, object]:
    """Build every engine on the same weights, then run the workload through each, interleaved by round.

    NOTE: the warm-up runs the whole workload once per engine, untimed: CPU GEMM libraries build
    kernels per new shape, and without it whichever engine runs first pays for everybody.
    """
    from engine.model.projection import native_bf16_gemm
    from engine.weights import load_model

    unknown = [n for n in engine_names if n not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; known: {', '.join(ENGINES)}")
    loaded = load_model(config.model, config.torch_dtype, config.seed)
    overrides = {"max_output_tokens": max_tokens} if max_tokens else {}
    items = make_workload(workload, **overrides).items(num_prompts, loaded.tokenizer, seed)
    engines = {name: ENGINES[name](config, loaded) for name in engine_names}
    for name, engine in engines.items():
        run_closed_loop(name, engine, items if warmup else items[:2], concurrency)
    runs: dict[str, list[BenchResult]] = {name: [] for name in engine_names}
    for r in range(rounds):
        order = engine_names if r % 2 == 0 else engine_names[::-1]
        for name in order:
            gc.collect()
            runs[name].append(run_closed_loop(name, engines[name], items, concurrency))
    results = {name: _best(rs) for name, rs in runs.items()}
    summary: dict[str, object] = {}
    for name, res in results.items():
        row = asdict(res)
        for baseline in BASELINES:
            if baseline in results:
                base = results[baseline]
                row[ratio_key(baseline)] = {
                    "output_tokens_per_s": res.output_tokens_per_s / base.output_tokens_per_s,
                    "requests_per_s": res.requests_per_s / base.requests_per_s,
                }
        summary[name] = row
    any_engine = next(iter(engines.values()))
    return {
        "model": loaded.name, "workload": workload, "num_prompts": num_prompts, "concurrency": concurrency,
        "max_tokens": max_tokens, "seed": seed, "rounds": rounds, "native_bf16_gemm": native_bf16_gemm(),
        "config": asdict(any_engine.config),  # type: ignore[attr-defined]
        "prompt_tokens_total": sum(len(i.prompt_token_ids) for i in items),
        "engines": summary,
    }


def ratio_key(baseline: str) -> str:
    """The JSON key of the ratios to one baseline, e.g. ``ratio_to_hf_cb``."""
    return "ratio_to_" + baseline.replace("-", "_")


def _best(results: list[BenchResult]) -> BenchResult:
    """The median round by throughput (rounds are interleaved across engines)."""
    ordered = sorted(results, key=lambda r: r.output_tokens_per_s)
    return ordered[len(ordered) // 2]


def _cmd_bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from engine.flags import engine_config_from_args

    report = run_bench(engine_config_from_args(args), args.engines.split(","), args.workload, args.num_prompts,
                       args.concurrency, args.max_tokens, args.seed, args.rounds, not args.no_warmup)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    table = Table(title=f"servescope bench: {report['model']}, {args.workload}, {args.num_prompts} prompts, "
                        f"concurrency {args.concurrency}")
    baselines = [b for b in BASELINES if b in report["engines"]]  # type: ignore[operator]
    for col in ("engine", "out tok/s", "req/s", "mean batch", "peak seqs", "KV waste", "preempt",
                *(f"x {b}" for b in baselines)):
        table.add_column(col)
    for name, row in report["engines"].items():  # type: ignore[union-attr]
        ratios = [row[ratio_key(b)]["output_tokens_per_s"] for b in baselines]
        table.add_row(name, f"{row['output_tokens_per_s']:.1f}", f"{row['requests_per_s']:.2f}",
                      f"{row['mean_batch_size']:.1f}", str(row["peak_concurrent_seqs"]),
                      f"{row['kv_waste_fraction']:.1%}", str(row["num_preemptions"]),
                      *(f"{r:.2f}" for r in ratios))
    print_whole(Console(), table)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``servescope bench``."""
    from engine.flags import add_engine_args

    p = subparsers.add_parser("bench", help="offline throughput of each engine and lever on one workload")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--workload", default="mixed", choices=sorted(WORKLOADS))
    p.add_argument("--max-tokens", type=int, default=None, help="cap on output tokens per request")
    p.add_argument("--engines", default="continuous,hf-cb,naive,static",
                   help=f"comma-separated, from: {', '.join(ENGINES)}")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds per engine; the median is kept")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed full pass per engine")
    p.add_argument("--json", default=None, help="write the results here")
    add_engine_args(p)
    p.set_defaults(func=_cmd_bench)

