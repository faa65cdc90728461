"""Resident memory of a built engine, as ``serve`` holds it: load the model, build, drop the loaded weights.

One configuration per process (RSS only grows), a 16 MiB KV pool so the weights dominate::

    python -m studies.engine_rss                 # defaults
    python -m studies.engine_rss weights=int8 dtype=bfloat16
"""

from __future__ import annotations

import gc
import sys

import psutil

from engine import EngineConfig, LLMEngine, SamplingParams


def main(argv: list[str]) -> None:
    proc = psutil.Process()
    fields = dict(arg.split("=", 1) for arg in argv)
    base = proc.memory_info().rss
    engine = LLMEngine(EngineConfig(model="smollm2-135m", kv_cache_mb=16, max_model_len=256, **fields))
    gc.collect()
    engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    gc.collect()
    print(f"{fields or 'defaults'}: RSS {proc.memory_info().rss / 2**20:.0f} MiB "
          f"(after imports {base / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main(sys.argv[1:])
