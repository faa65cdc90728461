"""A short step calibration in the server process, before the load: what a decode step costs at each batch size.

A run's own steps show the batch sizes it reached, never the ones a lever would reach (a run at 2 seats
never shows an 8-sequence step), and no step timer inside a forward can tell a slow execution path
from a heavy one. So before the load the server times decode steps of its own model at several batch
sizes (1, 2, 4, ... up to what twice its KV pool holds, at most :data:`MAX_BATCH`), at one
representative context, on its configured execution path and on the other one (eager vs optimized),
the two paths interleaved step by step so whatever else the machine does hits both alike. Each
(path, batch) keeps its best of ``repeats`` steps, as a peak is: what the path does on this machine.

Last, one prompt chunk (``context`` tokens, alone in its step) is timed on each path, for what the
other path saves on prompt rows.

It is written as ``step_calibration.json`` and read by two consumers, so they never disagree:
the execution verdict (the run's path against the optimized one at the run's median decode batch) and
the predictions (the batch-size curve of the forward, and the other path's ratio to it).

NOTE: every sequence shares one prompt but for its last token, with prefix caching on, so the prefill
is paid once per path, not once per sequence: the calibration costs a few decode steps per batch size.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probes.execution_paths import OPTIMIZED, PathTiming

MAX_BATCH = 16
DEFAULT_REPEATS = 2
DEFAULT_CONTEXT = 128
PATHS = ("eager", OPTIMIZED)
# The engine settings the calibration keeps from the run (its pool and seats are sized for the calibration).
KEPT_SETTINGS = ("max_num_batched_tokens", "block_size", "kv_layout", "enable_chunked_prefill", "attention_backend",
                 "dtype", "device", "num_threads", "weights", "seed")


@dataclass(slots=True)
class StepCalibration:
    """Best decode step and forward seconds per (path, batch size), measured before the load."""

    model: str
    dtype: str
    device: str
    context: int  # tokens of context per sequence
    run_path: str  # the path the server runs
    batches: list[int]  # ascending
    step_s: dict[str, list[float]]  # path -> best whole decode step per batch (engine.step(), host phases included)
    forward_s: dict[str, list[float]]  # path -> best model forward per batch
    repeats: int
    cost_s: float  # wall seconds the calibration took, engines built included
    measured_at: float
    method: str
    # path -> best forward of one prompt chunk of ``prefill_tokens`` tokens, nothing else in the step
    prefill_forward_s: dict[str, float] | None = None
    prefill_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepCalibration:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    @property
    def other_path(self) -> str | None:
        others = [p for p in self.step_s if p != self.run_path]
        return others[0] if others else None

    def forward(self, path: str, batch: float) -> float:
        """The path's forward seconds at ``batch`` sequences (piecewise linear between the calibrated sizes)."""
        return interpolate(self.batches, self.forward_s[path], batch)

    def step(self, path: str, batch: float) -> float:
        return interpolate(self.batches, self.step_s[path], batch)

    def forward_ratio(self, path: str, batch: float) -> float:
        """How many times faster ``path``'s forward is than the run's own at ``batch`` sequences."""
        return self.forward(self.run_path, batch) / self.forward(path, batch)

    def prefill_ratio(self, path: str) -> float | None:
        """How many times faster ``path`` computes a prompt chunk than the run's own path; None if not timed."""
        timed = self.prefill_forward_s or {}
        if path not in timed or self.run_path not in timed or timed[path] <= 0:
            return None
        return timed[self.run_path] / timed[path]

    def path_timing(self, batch: int, context: int | None = None) -> PathTiming:
        """Both paths' decode step at ``batch`` sequences, as the execution verdict reads it."""
        return PathTiming(model=self.model, dtype=self.dtype, device=self.device, batch=batch,
                          context=self.context if context is None else context, run_path=self.run_path,
                          step_s={path: self.step(path, batch) for path in self.step_s}, num_steps=self.repeats,
                          measured_at=self.measured_at,
                          method=(f"{self.method}; read at the run's median decode batch {batch} "
                                  f"(calibrated at {self.context}-token contexts)"))


def interpolate(batches: Sequence[int], values: Sequence[float], batch: float) -> float:
    """Piecewise linear in the batch size; past the largest size, the last segment's slope (never below its value)."""
    if len(batches) != len(values) or not batches:
        raise ValueError(f"a calibration needs one value per batch size, got {len(batches)} sizes, {len(values)} values")
    if batch <= batches[0] or len(batches) == 1:
        return values[0] if batch <= batches[0] else values[-1]
    for i in range(1, len(batches)):
        if batch <= batches[i]:
            b0, b1, v0, v1 = batches[i - 1], batches[i], values[i - 1], values[i]
            return v0 + (v1 - v0) * (batch - b0) / (b1 - b0)
    b0, b1, v0, v1 = batches[-2], batches[-1], values[-2], values[-1]
    return v1 + max(v1 - v0, 0.0) / (b1 - b0) * (batch - b1)


def calibration_batches(num_kv_blocks: int, block_size: int, context: int, num_steps: int,
                        max_batch: int = MAX_BATCH) -> list[int]:
    """Powers of two up to what twice the pool holds at ``context`` + ``num_steps`` tokens a sequence (the pool
    lever doubles it), at most ``max_batch``; at least [1]."""
    per_seq = math.ceil((context + num_steps) / block_size)
    most = max(1, min(max_batch, (2 * num_kv_blocks) // max(per_seq, 1)))
    return [2 ** k for k in range(int(math.log2(most)) + 1)]


def measure_calibration(loaded: Any, config: Any, context: int = DEFAULT_CONTEXT, batches: Sequence[int] | None = None,
                        repeats: int = DEFAULT_REPEATS, paths: Sequence[str] = PATHS) -> StepCalibration:
    """Time decode steps of ``loaded`` at each batch size on each path, under the settings of ``config`` (a
    finalized :class:`~engine.config.EngineConfig`, the run's), the paths interleaved step by step.

    One engine per path is built on ``loaded``; requests join as the batch grows (1, 2, 4, ...), each
    size gets one untimed step after its newcomers' prefill, then ``repeats`` timed steps per path.
    """
    from engine import EngineConfig, LLMEngine, SamplingParams

    started = time.perf_counter()
    if context < 1 or repeats < 1:
        raise ValueError(f"context and repeats must be >= 1, got {context}, {repeats}")
    max_model_len = int(config.max_model_len or loaded.config.max_position_embeddings)
    # Steps a sequence may take: per size, its newcomers' prefill and one untimed step, then the timed ones.
    num_steps = (int(math.log2(MAX_BATCH)) + 1) * (repeats + 3) + 2
    context = max(1, min(context, max_model_len // 2))
    if batches is None:
        batches = calibration_batches(int(config.num_kv_blocks), int(config.block_size), context, num_steps)
    batches = sorted(set(batches))
    num_steps = len(batches) * (repeats + 3) + 2
    if context + num_steps > max_model_len:
        context = max(1, max_model_len - num_steps)
    run_path = str(config.execution)
    order = [run_path, *[p for p in paths if p != run_path]]
    kept = {name: getattr(config, name) for name in KEPT_SETTINGS}
    # NOTE: a paged sequence only ever holds context + num_steps tokens; a contiguous one reserves max_model_len.
    is_contiguous = config.kv_layout == "contiguous"
    block = int(config.block_size)
    model_len = max_model_len if is_contiguous else min(max_model_len, math.ceil((context + num_steps + 1) / block) * block)
    per_seq_blocks = math.ceil(model_len / block) + (0 if is_contiguous else 1)
    engines = {path: LLMEngine(EngineConfig(model=config.model, execution=path, host_overhead_ms=0.0,
                                            enable_prefix_caching=True, max_num_seqs=batches[-1],
                                            max_model_len=model_len, num_kv_blocks=per_seq_blocks * batches[-1] + 2,
                                            **kept), loaded)
               for path in order}
    vocab = loaded.config.vocab_size
    shared = [(7 + 13 * j) % (vocab - 1) + 1 for j in range(context - 1)]
    params = SamplingParams(max_tokens=num_steps, ignore_eos=True)
    step_s: dict[str, list[float]] = {path: [] for path in order}
    forward_s: dict[str, list[float]] = {path: [] for path in order}
    timers = {path: _ForwardTimer() for path in order}
    for path, engine in engines.items():
        engine.add_observer(timers[path])
    num_added = 0
    for batch in batches:
        for path, engine in engines.items():
            for i in range(num_added, batch):
                engine.add_request([*shared, (i % (vocab - 1)) + 1], params, request_id=f"calibration-{path}-{i}")
            for _ in range(num_steps):  # bounded: the newcomers' prefill, until every sequence decodes
                engine.step()
                if timers[path].last_decode_batch == batch:
                    break
        num_added = batch
        steps: dict[str, list[float]] = {path: [] for path in order}
        forwards: dict[str, list[float]] = {path: [] for path in order}
        for _ in range(repeats):
            for path, engine in engines.items():
                start = time.perf_counter()
                engine.step()
                steps[path].append(time.perf_counter() - start)
                forwards[path].append(timers[path].last_forward_s)
        for path in order:
            step_s[path].append(min(steps[path]))
            forward_s[path].append(min(forwards[path]))
    for path, engine in engines.items():
        for i in range(num_added):
            engine.abort(f"calibration-{path}-{i}")
    # A prompt chunk alone in a step, on each path: big GEMMs, where the paths differ least.
    chunk = max(1, min(context, int(config.max_num_batched_tokens or context)))
    prefills: dict[str, list[float]] = {path: [] for path in order}
    for repeat in range(repeats):
        for path, engine in engines.items():
            # NOTE: a prompt of its own (no prefix-cache hit): every token is computed
            prompt = [(11 * repeat + 5 * j + 3) % (vocab - 1) + 1 for j in range(chunk)]
            engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True), request_id=f"prefill-{path}-{repeat}")
            engine.step()
            prefills[path].append(timers[path].last_forward_s)
            engine.abort(f"prefill-{path}-{repeat}")
    device = str(next(iter(engines.values())).config.device)
    cost = time.perf_counter() - started
    return StepCalibration(model=config.model, dtype=str(config.dtype), device=device, context=context,
                           run_path=run_path, batches=list(batches), step_s=step_s, forward_s=forward_s,
                           repeats=repeats, cost_s=cost, measured_at=time.time(),
                           prefill_forward_s={path: min(t) for path, t in prefills.items()}, prefill_tokens=chunk,
                           method=(f"best of {repeats} decode steps per path and batch size, paths interleaved, "
                                   f"in the server process before the load ({cost:.1f} s)"))


class _ForwardTimer:
    """The last step's forward seconds and, when it decoded only, its batch size."""

    def __init__(self) -> None:
        self.last_forward_s = 0.0
        self.last_decode_batch: int | None = None

    def on_step(self, stats: Any) -> None:
        self.last_forward_s = stats.forward_s
        self.last_decode_batch = stats.num_decode_tokens if stats.num_prefill_tokens == 0 else None

    def on_request_event(self, event: Any) -> None:
        pass
