"""What the optimized execution path would take for a run's own decode steps, measured on this machine.

The execution lever (fused GEMMs, prepacked weights, reused buffers, CUDA graphs) works inside the
forward pass, where no step timer can tell a slow path from a heavy one. So it is measured as a
counterfactual: the engine is built once per execution path on the same weights, given the run's
own decode batch (``batch`` sequences of ``context`` tokens), and each path's decode steps are
timed interleaved (path A, path B, A, B, ...), so whatever else the machine does hits both alike.
This happens after the load, on the machine that served it, with nothing of ours running, and is
written as ``execution_reference.json`` (``servescope load``: the optimized path alone, at the batch
the client saw decoding, for a target whose model is known here).

:class:`PathTiming` is also how the execution verdict reads our own engine's two paths; those come
from the step calibration the probed server measures before the load (:mod:`probes.step_calibration`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

OPTIMIZED = "optimized"
TARGET = "target"  # the server under test, timed from its client (execution_reference.json)


@dataclass(slots=True)
class PathTiming:
    """Decode step time of each execution path on one batch shape, measured side by side.

    NOTE: each path's figure is its best round, as a peak is: what the path can do on this machine;
    a slower round was disturbed by something else (this machine is shared), whichever path it hit.
    """

    model: str
    dtype: str
    device: str
    batch: int
    context: int
    run_path: str | None  # the path the run itself used (None for a server seen from outside)
    step_s: dict[str, float]  # path -> best decode step of the rounds (host phases included)
    num_steps: int
    measured_at: float
    method: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PathTiming:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})

    @property
    def optimized_s(self) -> float:
        return self.step_s[OPTIMIZED]

    def share_removed(self, step_s: float | None = None) -> float | None:
        """The share of a step (``step_s``, default the run path's own timing) the optimized path would remove.

        Negative when the optimized path is slower on this shape; None without a step to compare.
        """
        if step_s is None:
            step_s = self.step_s.get(self.run_path) if self.run_path else None
        if step_s is None or step_s <= 0:
            return None
        return 1.0 - self.optimized_s / step_s


def decode_shape(steps: pd.DataFrame) -> tuple[int, int] | None:
    """The run's typical decode step: (median sequences per step, median context per sequence)."""
    decode = steps[(steps["num_prefill_tokens"] == 0) & (steps["num_decode_tokens"] > 0)]
    if decode.empty:
        return None
    context = decode["num_kv_slots_used"] / decode["num_running"].clip(lower=1)
    return max(1, round(float(decode["num_seqs"].median()))), max(1, round(float(context.median())))


def measure_paths(model: str, batch: int, context: int, paths: tuple[str, ...] = ("eager", OPTIMIZED),
                  dtype: str = "float32", device: str = "cpu", num_threads: int | None = None,
                  num_steps: int = 12, run_path: str | None = None, seed: int = 0,
                  target: Callable[[], float] | None = None,
                  settings: dict[str, Any] | None = None) -> PathTiming:
    """Time ``num_steps`` decode steps of ``batch`` sequences at ``context`` tokens on each of ``paths`` (best of).

    The optimized path is always among those timed. Each engine gets a KV pool just big enough for
    the batch, distinct prompts (no prefix-cache hits) and ``ignore_eos``; one decode step per path is
    a warm-up and not timed. ``target``, when given, returns the seconds of one decode step of the
    server under test (as its client sees it) and is timed in the same rounds, as path ``"target"``.
    ``settings`` are engine settings every path shares (the run's own: its pool, its seats, its
    host overhead); otherwise the engine's defaults, with room for the batch.
    """
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.weights import load_model

    if batch < 1 or context < 1 or num_steps < 1:
        raise ValueError(f"batch, context and num_steps must be >= 1, got {batch}, {context}, {num_steps}")
    paths = tuple(dict.fromkeys((*paths, OPTIMIZED)))
    # NOTE: the model's own weights, never a random twin of its shape: dummy:smollm2-shape's random
    # weights take 3x the time of the real ones per decode step on a CPU (docs/results.md).
    source = model
    probe = EngineConfig(model=source, dtype=dtype)
    loaded = load_model(source, probe.torch_dtype, seed)
    context = min(context, loaded.config.max_position_embeddings - num_steps - 4)
    max_tokens = num_steps + 3  # the prefill's token, one warm-up step, the timed steps, one spare
    shared = {"enable_prefix_caching": False, **(settings or {})}
    block_size = shared.setdefault("block_size", 16)
    blocks_per_seq = math.ceil((context + max_tokens) / block_size) + 1
    # NOTE: room for the batch whatever the run had: no step of the measurement may queue or preempt.
    shared["max_num_seqs"] = max(shared.get("max_num_seqs") or 0, batch)
    if shared.get("num_kv_blocks") is not None:
        shared["num_kv_blocks"] = max(shared["num_kv_blocks"], batch * blocks_per_seq)
    if shared.get("max_model_len") is not None:
        shared["max_model_len"] = max(shared["max_model_len"], blocks_per_seq * block_size)
    engines = {path: LLMEngine(EngineConfig(model=source, dtype=dtype, device=device, num_threads=num_threads,
                                            execution=path, seed=seed, **shared), loaded) for path in paths}
    vocab = loaded.config.vocab_size
    for path, engine in engines.items():
        for i in range(batch):
            prompt = [(7 * i + 13 * j) % (vocab - 1) + 1 for j in range(context)]
            engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                               request_id=f"{path}-{i}")
        started: set[str] = set()
        while len(started) < batch:  # the prefill, chunked or not, until every sequence decodes
            started.update(out.request_id for out in engine.step() if out.token_ids)
        engine.step()  # warm-up decode step
    timings: dict[str, list[float]] = {path: [] for path in (*paths, *((TARGET,) if target else ()))}
    for _ in range(num_steps):
        for path, engine in engines.items():
            start = time.perf_counter()
            engine.step()
            timings[path].append(time.perf_counter() - start)
        if target is not None:
            timings[TARGET].append(target())
    device_name = next(iter(engines.values())).config.device
    return PathTiming(model=model, dtype=dtype, device=str(device_name), batch=batch, context=context,
                      run_path=run_path, step_s={p: min(t) for p, t in timings.items()},
                      num_steps=num_steps, measured_at=time.time(),
                      method=(f"best of {num_steps} decode steps per path, paths interleaved, after the load; "
                              f"{source} weights" + (f", {num_threads} threads" if num_threads else "")))
