"""Greedy-token agreement of every fast configuration with float32 and with HF, on the oracle prompts.

For each engine configuration (``--engine FLAGS``, repeatable) and, optionally, llama-server: greedy
continuations of the 8 oracle prompts of tests/engine/test_oracle.py (SmolLM2-135M from the bundled GGUF),
compared token by token with the engine in float32 (dense weights, the reference configuration) and with
HF transformers' float32 forward of the same GGUF. Per configuration: how many prompts agree on every
token, the mean and shortest agreeing prefix, and the largest last-position logit difference from HF.

    python -m studies.fast_path_accuracy --tokens 32 --engine "--dtype bfloat16" \\
        --engine "--dtype bfloat16 --weights int4" --engine "--dtype float32 --weights int4" \\
        [--llama-server /work/peers/llama/build/bin/llama-server]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch
import transformers

from engine import LLM, SamplingParams
from engine.flags import add_engine_args, engine_config_from_args
from engine.weights import load_model
from engine.weights.fetch import fetch_smollm2
from tests.engine.hf_oracle import hf_greedy, hf_last_logits
from tests.engine.test_oracle import REAL_PROMPTS, _engine_prefill_logits


def agreed_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def engine_tokens(flags: str, prompt_ids: list[list[int]], num_tokens: int,
                  hf: transformers.PreTrainedModel | None) -> tuple[list[list[int]], float | None]:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(shlex.split(flags)))
    # NOTE: every flag given (--int4-act-bits, --int4-dense-rows, ...), not only the dtype and weight form
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in ("model", "device")}
    llm = LLM("smollm2-135m", loaded=load_model("smollm2-135m", config.torch_dtype), device="cpu", **fields)
    outputs = llm.generate(prompt_ids, SamplingParams(max_tokens=num_tokens, ignore_eos=True))
    logit_error = None
    if hf is not None:
        logit_error = max(float((_engine_prefill_logits(llm.engine, ids) - hf_last_logits(hf, ids)).abs().max())
                          for ids in prompt_ids)
    return [list(o.token_ids) for o in outputs], logit_error


def llama_server_tokens(binary: Path, gguf: Path, prompt_ids: list[list[int]], num_tokens: int) -> list[list[int]]:
    """Greedy tokens from llama-server's /completion (top_k 1, temperature 0), one prompt at a time."""
    port = 18000 + int(time.time()) % 1000
    proc = subprocess.Popen([str(binary), "-m", str(gguf), "-t", "2", "-np", "1", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        tokens = []
        for ids in prompt_ids:
            body = json.dumps({"prompt": ids, "n_predict": num_tokens, "temperature": 0, "top_k": 1,
                               "ignore_eos": True, "return_tokens": True, "cache_prompt": False}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as r:
                tokens.append(list(json.loads(r.read())["tokens"]))
        return tokens
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", action="append", default=[], help="engine flags of one configuration (repeatable)")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--llama-server", type=Path, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    gguf = fetch_smollm2()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           dtype=torch.float32).eval()
    base = load_model("smollm2-135m")
    prompt_ids = [base.tokenizer.encode(p) for p in REAL_PROMPTS]
    hf_out = [hf_greedy(hf, ids, args.tokens) for ids in prompt_ids]
    reference, _ = engine_tokens("--dtype float32", prompt_ids, args.tokens, None)
    results: dict[str, dict[str, object]] = {}
    configs: dict[str, tuple[list[list[int]], float | None]] = {
        "servescope --dtype float32 (reference)": engine_tokens("--dtype float32", prompt_ids, args.tokens, hf)}
    for flags in args.engine:
        configs[f"servescope {flags}"] = engine_tokens(flags, prompt_ids, args.tokens, hf)
    if args.llama_server is not None:
        configs[f"llama-server ({args.llama_server.parent.parent.name})"] = (
            llama_server_tokens(args.llama_server, gguf, prompt_ids, args.tokens), None)
    print(f"{len(prompt_ids)} oracle prompts, {args.tokens} greedy tokens each\n")
    print("| configuration | same as float32: prompts, mean prefix (min) | same as HF float32: prompts, mean "
          "prefix (min) | max logit diff from HF |")
    print("|---|---|---|---|")
    for name, (tokens, logit_error) in configs.items():
        row: dict[str, object] = {"logit_error": logit_error}
        cells = []
        for ref_name, ref in (("float32", reference), ("hf", hf_out)):
            prefixes = [agreed_prefix(a, b) for a, b in zip(tokens, ref, strict=True)]
            full = sum(n == args.tokens for n in prefixes)
            row[ref_name] = {"prefixes": prefixes, "all_same": full}
            cells.append(f"{full}/{len(prefixes)}, {sum(prefixes) / len(prefixes):.1f} ({min(prefixes)})")
        results[name] = row
        error = "-" if logit_error is None else f"{logit_error:.3f}"
        print(f"| {name} | {cells[0]} | {cells[1]} | {error} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokens": args.tokens, "prompts": REAL_PROMPTS, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
