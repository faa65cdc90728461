"""Single-stream decode: plain HF ``generate`` vs the engine at batch 1, interleaved in one process.

What `transformers serve` (no continuous batching) runs per request is ``model.generate`` on
``LlamaForCausalLM``; this times that loop and the engine's own ``step`` loop on the same weights,
one request at a time, alternating HF and engine configurations round by round so that machine
noise hits all alike. TPOT is the mean gap between output tokens after the first; TTFT is excluded.
Run it under the exclusive lock, e.g.::

    flock /tmp/ss-cpu.lock python -m studies.single_stream --rounds 5 --max-tokens 64 \\
        --engine "--dtype float32" --engine "--dtype bfloat16" --engine "--weights int8" --hf float32

``--profile DIR`` writes a torch-profiler table of a few engine decode steps per engine instead.
``--bandwidth`` also measures this machine's copy bandwidth (``probes/peaks.py``) and prints each engine's
weight bytes read per token over its TPOT as a share of it (the single-stream bandwidth use): against the best
copy of the session on all threads (strict), and paired: each run's rate against the copy measured on its
own threads right before and right after that run, the median over the rounds with their range; paired both by
the run's TPOT (its mean token gap) and by its median token gap, which a stall of the process does not move.

NOTE: on a shared host the copy bandwidth moves from one second to the next (24 to 48 GB/s between two
copies a second apart, 2-core EPYC, 2026-12-06); a share against a copy from minutes earlier, or against the
best burst of the session, says as much about the neighbours as about the engine.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from engine import LLMEngine, SamplingParams
from engine.baselines.hf_model import hf_model_from
from engine.flags import add_engine_args, engine_config_from_args
from engine.weights import LoadedModel, load_model
from probes.peaks import measure_copy_bandwidth

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


@dataclass(slots=True)
class Timings:
    tpot_s: list[float] = field(default_factory=list)  # each run's mean gap between output tokens (its TPOT)
    itl_s: list[float] = field(default_factory=list)  # each run's median gap (its inter-token latency p50)
    tokens: list[int] = field(default_factory=list)
    copy_around: list[float] = field(default_factory=list)  # the copy bandwidth right before and after each run


class _Stamps:
    """An HF streamer that stamps each new token's arrival (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if self._seen_prompt:
            self.times.append(time.perf_counter())
        self._seen_prompt = True

    def end(self) -> None:
        pass


def _gaps(stamps: list[float]) -> tuple[float, float]:
    """A run's TPOT (the mean gap between its output tokens) and its median gap (the token a stall did not hold)."""
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), statistics.median(gaps)


def hf_run(model: torch.nn.Module, prompt_ids: list[int], max_tokens: int) -> tuple[tuple[float, float], list[int]]:
    stamps = _Stamps()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, streamer=stamps, pad_token_id=0)
    return _gaps(stamps.times), out[0, len(prompt_ids):].tolist()


def engine_run(engine: LLMEngine, prompt_ids: list[int], max_tokens: int) -> tuple[tuple[float, float], list[int]]:
    engine.add_request(prompt_ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    stamps: list[float] = []
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            stamps.append(time.perf_counter())
            tokens = out.token_ids
    return _gaps(stamps), list(tokens)


def _engine(flags: str, loaded_by_dtype: dict[str, LoadedModel]) -> LLMEngine:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(shlex.split(flags)))
    if config.dtype not in loaded_by_dtype:
        loaded_by_dtype[config.dtype] = load_model(config.model, config.torch_dtype, config.seed)
    return LLMEngine(config, loaded_by_dtype[config.dtype])


def profile_decode(engine: LLMEngine, prompt_ids: list[int], out_path: str) -> None:
    """Per-op CPU time of 8 decode steps (after the prompt and 4 warm steps)."""
    from torch.profiler import ProfilerActivity, profile

    engine.add_request(prompt_ids, SamplingParams(max_tokens=14, ignore_eos=True))
    for _ in range(5):
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(8):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    with open(out_path, "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    prof.export_chrome_trace(out_path + ".trace.json")


def _copy_bandwidths(thread_counts: set[int]) -> dict[int, float]:
    """This machine's copy bandwidth (bytes read + written per second, ``probes/peaks.py``) per thread count."""
    return {t: measure_copy_bandwidth(t) for t in sorted(thread_counts)}


def _report_bandwidth(runners: dict[str, object], report: dict[str, dict], before: dict[int, float],
                      threads: dict[str, int], default_threads: int, timings: dict[str, Timings]) -> float:
    """Print each engine's weight read rate against the copy bandwidth measured before and after the rounds.

    The share is taken against the machine's copy bandwidth on all its threads (``default_threads``), the
    best of the two measurements: the strict reference, whatever threads the engine itself runs on. The
    copy bandwidth at the engine's own thread count is printed beside it.
    """
    after = _copy_bandwidths(set(before))
    best = {t: max(before[t], after[t]) for t in before}
    for t in sorted(before):
        print(f"\ncopy bandwidth on {t} thread(s): {before[t] / 1e9:.1f} GB/s before the rounds, "
              f"{after[t] / 1e9:.1f} after (probes/peaks.py, best of 5 copies of 128 MiB)", end="")
    print()
    machine = best[default_threads]
    for name, runner in runners.items():
        nbytes = runner.decode_weight_bytes() if isinstance(runner, LLMEngine) else None
        if nbytes is None:
            continue
        rate = nbytes / report[name]["tpot_p50_s"]
        own = best[threads[name]]
        report[name].update(weight_bytes=nbytes, weight_gb_s=rate / 1e9, of_copy_bandwidth=rate / machine,
                            of_copy_bandwidth_same_threads=rate / own)
        print(f"{name:<48} {nbytes / 1e6:6.1f} MB per token, {rate / 1e9:5.1f} GB/s = {rate / machine:.0%} of the "
              f"machine's copy bandwidth ({machine / 1e9:.1f} GB/s, {default_threads} threads); {rate / own:.0%} of "
              f"the copy on its own {threads[name]} thread(s)")
        copies = timings[name].copy_around
        for label, key, times in (("TPOT", "of_paired_copy", timings[name].tpot_s),
                                  ("median token gap", "of_paired_copy_itl", timings[name].itl_s)):
            paired = [nbytes / t / copy for t, copy in zip(times, copies, strict=True)]
            report[name].update({key: paired, f"{key}_p50": statistics.median(paired)})
            print(f"{'':<48} paired, by {label}: {statistics.median(paired):.0%} (rounds {min(paired):.0%}-"
                  f"{max(paired):.0%}) of the copy measured on its {threads[name]} thread(s) right before and after "
                  f"each round ({min(copies) / 1e9:.1f}-{max(copies) / 1e9:.1f} GB/s)")
    return machine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", action="append", default=[], help="engine flags of one configuration (repeatable)")
    p.add_argument("--hf", action="append", default=[],
                   help="dtype of an HF generate baseline (repeatable; float32 when none is given; 'none' for no baseline)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", default=None, help="write a profiler table per engine to PROFILE.<i>.txt")
    p.add_argument("--json", default=None)
    p.add_argument("--bandwidth", action="store_true", help="print each engine's single-stream bandwidth use")
    args = p.parse_args(argv)
    args.hf = args.hf or ["float32"]  # the ratio column's reference
    args.hf = [] if args.hf == ["none"] else args.hf
    if args.threads:
        torch.set_num_threads(args.threads)
    default_threads = torch.get_num_threads()
    loaded: dict[str, LoadedModel] = {}
    runners: dict[str, object] = {}
    for flags in args.engine:
        runners[f"servescope {flags}".strip()] = _engine(f"--model {args.model} {flags}", loaded)
    for dtype_name in args.hf:
        base = loaded.get("float32") or load_model(args.model, torch.float32)
        loaded.setdefault("float32", base)
        model = hf_model_from(base.config, base.state_dict, getattr(torch, dtype_name))
        model.config._attn_implementation = "sdpa"  # what from_pretrained (and transformers serve) picks
        runners[f"HF generate {dtype_name} (sdpa)"] = model
    any_loaded = next(iter(loaded.values()))
    prompt_ids = any_loaded.tokenizer.encode(PROMPT)
    if args.profile:
        for i, (name, runner) in enumerate(runners.items()):
            if isinstance(runner, LLMEngine):
                profile_decode(runner, prompt_ids, f"{args.profile}.{i}.txt")
                print(f"{name}: {args.profile}.{i}.txt")
        return 0
    run = {name: (engine_run if isinstance(r, LLMEngine) else hf_run) for name, r in runners.items()}
    # NOTE: an engine's --num-threads sets torch's threads for the whole process when it is built, so each
    # configuration gets its own count back before every run of it (the last one built no longer decides).
    threads = {name: (r.config.num_threads if isinstance(r, LLMEngine) else None) or default_threads
               for name, r in runners.items()}
    for name, runner in runners.items():  # warm-up: kernels and buffers for every shape
        torch.set_num_threads(threads[name])
        run[name](runner, prompt_ids, 8)
    copy_before = _copy_bandwidths({default_threads, *threads.values()}) if args.bandwidth else {}
    timings = {name: Timings() for name in runners}
    names = list(runners)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            gc.collect()
            before = measure_copy_bandwidth(threads[name]) if args.bandwidth else 0.0
            torch.set_num_threads(threads[name])
            (tpot, itl), tokens = run[name](runners[name], prompt_ids, args.max_tokens)
            timings[name].tpot_s.append(tpot)
            timings[name].itl_s.append(itl)
            timings[name].tokens = tokens
            if args.bandwidth:
                timings[name].copy_around.append((before + measure_copy_bandwidth(threads[name])) / 2)
    reference = next((n for n in names if n.startswith("HF generate float32")), names[0])
    ref_tpot = statistics.median(timings[reference].tpot_s)
    report = {}
    print(f"{'configuration':<48} {'threads':>7} {'TPOT p50 ms':>11} {'tok/s':>7} {'vs ' + reference[:20]:>24}"
          f"  same tokens")
    for name in names:
        tpot = statistics.median(timings[name].tpot_s)
        same = timings[name].tokens == timings[reference].tokens
        report[name] = {"tpot_s": timings[name].tpot_s, "tpot_p50_s": tpot, "ratio": tpot / ref_tpot,
                        "itl_s": timings[name].itl_s,
                        "same_tokens_as_reference": same, "threads": threads[name]}
        print(f"{name:<48} {threads[name]:7d} {tpot * 1e3:11.1f} {1 / tpot:7.1f} {tpot / ref_tpot:23.2f}x  {same}")
    copy_bw = None
    if args.bandwidth:
        copy_bw = _report_bandwidth(runners, report, copy_before, threads, default_threads, timings)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"reference": reference, "max_tokens": args.max_tokens, "rounds": args.rounds,
                       "threads": default_threads, "copy_bandwidth_bytes_per_s": copy_bw,
                       "results": report}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
