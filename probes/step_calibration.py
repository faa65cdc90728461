"""A short step calibration in the server process, before the load: what a decode step costs at each batch size,
on the run's own way and on every other way the engine could run the same model (the execution levers).

A run's own steps show the batch sizes it reached, never the ones a lever would reach (a run at 2 seats
never shows an 8-sequence step), and no step timer inside a forward can tell a slow execution path
from a heavy one. So before the load the server times decode steps of its own model at several batch
sizes (1, 2, 4, ... up to what twice its KV pool holds, at most :data:`MAX_BATCH`), at one
representative context, with the run's settings and with each execution variant the device runs
natively (:mod:`probes.execution_variants`: the optimized path for an eager run, bfloat16, int8/int4
weights, the other attention backend), interleaved step by step so whatever else the machine does
hits all alike. Each (variant, batch) keeps its best of ``repeats`` steps, as a peak is: what the
variant does on this machine. Each decoding sequence samples as the load's requests do (temperature 1,
what the server gives a request that names none): a sampled row costs a softmax and a draw over the
vocabulary, more than an argmax, and a batch of 16 pays it 16 times. Then one prompt chunk, alone in its
step, is timed on each variant, for what a variant saves on prompt rows: as many tokens as the load's
prompt steps carry (:func:`typical_prompt_step`: the prompts that start together, cut to the token
budget), since a bigger chunk saves a different share; and each variant that changes the numbers is
compared with the run's own on a few fixed prompts (:mod:`probes.accuracy`): its price.

It is written as ``step_calibration.json`` and read by two consumers, so they never disagree:
the execution verdict (the run's path against the optimized one at the run's median decode batch) and
the predictions (the batch-size curve of the forward, and each variant's forward against it). It is
kept per machine, model, code and settings (:mod:`probes.calibration_cache`): a second run reads it.

NOTE: every sequence shares one prompt but for its last token, with prefix caching on, so the prefill
is paid once per variant, not once per sequence: the calibration costs a few decode steps per batch size.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probes.accuracy import LeverAccuracy, measure_accuracy
from probes.calibration_cache import cache_key, model_identity, read_cached, write_cached
from probes.execution_paths import OPTIMIZED, PathTiming
from probes.execution_variants import ExecutionVariant, execution_variants

MAX_BATCH = 16
LEVER_BATCHES = (1, 4, 16)
# How the calibration's sequences sample: as the load's requests do, which name no temperature and get the
# server's default (engine.server.inputs.DEFAULT_TEMPERATURE).
SAMPLING_TEMPERATURE = 1.0
DEFAULT_REPEATS = 2  # decode steps per (variant, batch size), the first at that size included
# Prompt chunks per variant: one, as long as the load's prompt steps, costs what two of a decode context did.
PROMPT_REPEATS = 1
DEFAULT_CONTEXT = 128
PATHS = ("eager", OPTIMIZED)
# The engine settings the calibration keeps from the run (its pool and seats are sized for the calibration).
KEPT_SETTINGS = ("max_num_batched_tokens", "block_size", "kv_layout", "enable_chunked_prefill", "attention_backend",
                 "dtype", "device", "num_threads", "weights", "int4_act_bits", "seed")


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
    # variant -> the engine settings it changes from the run's (the run's own: {}); None in older files, whose
    # only variants were the two execution paths
    variants: dict[str, dict[str, str]] | None = None
    accuracy: dict[str, dict[str, Any]] | None = None  # variant -> probes.accuracy.LeverAccuracy, numeric ones
    failed: dict[str, str] | None = None  # variant -> why it was not timed (or its accuracy not measured)
    accuracy_s: float | None = None  # of cost_s, the accuracy measurement's share
    cache_key: str | None = None
    cached: bool = False  # read from the cache (probes.calibration_cache): this run paid load_s, not cost_s
    load_s: float | None = None  # what this run paid for it (cost_s when measured now)
    # variant -> its batch sizes, where fewer than ``batches`` (the levers' are timed at a few sizes); None: all
    variant_batches: dict[str, list[int]] | None = None
    temperature: float | None = None  # how the decoding sequences sampled (None in older files: greedy)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepCalibration:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    @property
    def other_path(self) -> str | None:
        """The other execution path (eager or optimized) when it was timed."""
        others = [p for p in self.step_s if p != self.run_path and p in PATHS]
        return others[0] if others else None

    def changes(self, name: str) -> dict[str, str]:
        """The engine settings variant ``name`` changes from the run's (an older file's paths: the path)."""
        if self.variants is not None and name in self.variants:
            return dict(self.variants[name])
        return {} if name == self.run_path else {"execution": name}

    def lever_variants(self) -> list[str]:
        """Every timed variant but the run's own, in the order they were timed."""
        return [name for name in self.forward_s if name != self.run_path]

    def lever_accuracy(self, name: str) -> LeverAccuracy | None:
        data = (self.accuracy or {}).get(name)
        return LeverAccuracy.from_dict(data) if data is not None else None

    def forward(self, path: str, batch: float) -> float:
        """The path's forward seconds at ``batch`` sequences (piecewise linear between the calibrated sizes)."""
        return interpolate(self.batches_of(path), self.forward_s[path], batch)

    def step(self, path: str, batch: float) -> float:
        return interpolate(self.batches_of(path), self.step_s[path], batch)

    def batches_of(self, name: str) -> list[int]:
        """The batch sizes variant ``name`` was timed at."""
        return list((self.variant_batches or {}).get(name) or self.batches)

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
                          step_s={path: self.step(path, batch) for path in self.step_s if path in PATHS},
                          num_steps=self.repeats,
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


def lever_batches(batches: Sequence[int]) -> list[int]:
    """The few batch sizes a lever variant is timed at: 1, 4 and 16 where calibrated, and the largest (the run's own
    way is timed at every size, for the seat and pool levers; a lever's curve between them is near linear)."""
    return sorted({b for b in batches if b in LEVER_BATCHES} | {batches[0], batches[-1]})


def typical_prompt_step(median_prompt: float, concurrency: int, budget: int) -> int:
    """The prompt tokens a step of this load typically computes: the prompts of the sequences that start together
    (``concurrency``: a closed loop's users or the seats, whichever fewer, begin together and, with like lengths,
    finish and send again together), cut to the step's token ``budget``; at least one token."""
    if concurrency < 1 or budget < 1:
        raise ValueError(f"concurrency and budget must be >= 1, got {concurrency}, {budget}")
    return max(1, min(budget, round(concurrency * median_prompt)))


def calibration_batches(num_kv_blocks: int, block_size: int, context: int, num_steps: int,
                        max_batch: int = MAX_BATCH) -> list[int]:
    """Powers of two up to what twice the pool holds at ``context`` + ``num_steps`` tokens a sequence (the pool
    lever doubles it), at most ``max_batch``; at least [1]."""
    per_seq = math.ceil((context + num_steps) / block_size)
    most = max(1, min(max_batch, (2 * num_kv_blocks) // max(per_seq, 1)))
    return [2 ** k for k in range(int(math.log2(most)) + 1)]


def calibrate(loaded: Any, config: Any, context: int = DEFAULT_CONTEXT,
              prompt_tokens: int | None = None) -> StepCalibration:
    """The run's calibration: read from the cache when this machine, model, code and settings were calibrated
    before (``cached``, ``load_s`` what reading it cost), else measured now (:func:`measure_calibration`) and kept.
    ``prompt_tokens``: the prompt chunk to time (default: ``context`` tokens, cut to the token budget)."""
    started = time.perf_counter()
    variants = execution_variants(config, config.torch_device)
    settings = {**{name: getattr(config, name) for name in KEPT_SETTINGS}, "execution": config.execution,
                "num_kv_blocks": config.num_kv_blocks, "max_model_len": config.max_model_len, "model": config.model,
                "context": context, "prompt_tokens": prompt_tokens, "repeats": DEFAULT_REPEATS,
                "temperature": SAMPLING_TEMPERATURE, "variants": [v.name for v in variants]}
    key = cache_key(model_identity(config.model, str(loaded.source)), settings)
    kept = read_cached(key)
    if kept is not None:
        try:
            calibration = StepCalibration.from_dict(kept)
        except (KeyError, TypeError):
            calibration = None
        if calibration is not None:
            calibration.cached, calibration.cache_key = True, key
            calibration.load_s = time.perf_counter() - started
            return calibration
    calibration = measure_calibration(loaded, config, context, variants=variants, prompt_tokens=prompt_tokens)
    calibration.cache_key, calibration.load_s = key, calibration.cost_s
    write_cached(key, calibration.to_dict())
    return calibration


def measure_calibration(loaded: Any, config: Any, context: int = DEFAULT_CONTEXT, batches: Sequence[int] | None = None,
                        repeats: int = DEFAULT_REPEATS, variants: Sequence[ExecutionVariant] | None = None,
                        with_accuracy: bool = True, prompt_tokens: int | None = None) -> StepCalibration:
    """Time decode steps of ``loaded`` at each batch size on the run's own way and every ``variants`` (default: the
    execution levers this device runs natively, :func:`~probes.execution_variants.execution_variants`), under the
    settings of ``config`` (a finalized :class:`~engine.config.EngineConfig`, the run's), interleaved step by step;
    then one prompt chunk of ``prompt_tokens`` tokens each (default ``context``; at most the token budget), and
    (``with_accuracy``) what each variant that changes the numbers costs in accuracy.

    One engine per variant is built on ``loaded``; requests join as the batch grows (1, 2, 4, ...), each
    size gets its newcomers' prefill, then ``repeats`` decode steps per variant, the first of them right after.
    A variant whose engine cannot be built here is left out, with the reason in ``failed``.
    """
    from engine import EngineConfig, LLMEngine, SamplingParams

    started = time.perf_counter()
    if context < 1 or repeats < 1:
        raise ValueError(f"context and repeats must be >= 1, got {context}, {repeats}")
    if variants is None:
        variants = execution_variants(config, config.torch_device)
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
    kept = {name: getattr(config, name) for name in KEPT_SETTINGS}
    changes: dict[str, dict[str, str]] = {run_path: {}}
    changes.update({v.name: dict(v.changes) for v in variants if v.name != run_path})
    # A prompt chunk as the load's prompt steps carry it: at most the token budget (a step computes no more).
    budget = int(config.max_num_batched_tokens or context)
    chunk = max(1, min(prompt_tokens or context, budget, max_model_len - 1))
    # NOTE: a paged decoding sequence only ever holds context + num_steps tokens, the chunk its tokens and one
    # output, never both at once: the pool holds the larger need (the optimized CPU path faults all of it in
    # when built); a contiguous sequence reserves max_model_len.
    is_contiguous = config.kv_layout == "contiguous"
    block = int(config.block_size)
    model_len = max_model_len if is_contiguous else min(max_model_len,
                                                        math.ceil((max(context + num_steps, chunk) + 1) / block) * block)
    if is_contiguous:
        num_blocks = math.ceil(model_len / block) * batches[-1] + 2
    else:
        decode_blocks = (math.ceil((context + num_steps + 1) / block) + 1) * batches[-1]
        num_blocks = max(decode_blocks, math.ceil((chunk + 1) / block) + 1) + 2
    engines: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name, change in changes.items():
        settings = {**kept, "execution": run_path, **change}
        try:
            engines[name] = LLMEngine(EngineConfig(model=config.model, host_overhead_ms=0.0, enable_prefix_caching=True,
                                                   max_num_seqs=batches[-1], max_model_len=model_len,
                                                   num_kv_blocks=num_blocks, **settings), loaded)
        except (ValueError, RuntimeError) as exc:
            if name == run_path:
                raise
            failed[name] = f"{type(exc).__name__}: {exc}"
    order = list(engines)
    vocab = loaded.config.vocab_size
    shared = [(7 + 13 * j) % (vocab - 1) + 1 for j in range(context - 1)]
    params = SamplingParams(max_tokens=num_steps, ignore_eos=True, temperature=SAMPLING_TEMPERATURE)
    step_s: dict[str, list[float]] = {name: [] for name in order}
    forward_s: dict[str, list[float]] = {name: [] for name in order}
    timers = {name: _ForwardTimer() for name in order}
    for name, engine in engines.items():
        engine.add_observer(timers[name])
    timed_at = {name: (list(batches) if name == run_path else lever_batches(batches)) for name in order}
    num_added = dict.fromkeys(order, 0)
    for batch in batches:
        timing = [name for name in order if batch in timed_at[name]]
        steps: dict[str, list[float]] = {name: [] for name in timing}
        forwards: dict[str, list[float]] = {name: [] for name in timing}
        for name in timing:
            engine = engines[name]
            for i in range(num_added[name], batch):
                engine.add_request([*shared, (i % (vocab - 1)) + 1], params, request_id=f"calibration-{name}-{i}")
            num_added[name] = batch
            for _ in range(num_steps):  # bounded: the newcomers' prefill, until every sequence decodes
                start = time.perf_counter()
                engine.step()
                if timers[name].last_decode_batch == batch:  # the first decode step at this size is a sample too
                    steps[name].append(time.perf_counter() - start)
                    forwards[name].append(timers[name].last_forward_s)
                    break
        for _ in range(repeats - 1):
            for name in timing:
                start = time.perf_counter()
                engines[name].step()
                steps[name].append(time.perf_counter() - start)
                forwards[name].append(timers[name].last_forward_s)
        for name in timing:
            step_s[name].append(min(steps[name]))
            forward_s[name].append(min(forwards[name]))
    for name, engine in engines.items():
        for i in range(num_added[name]):
            engine.abort(f"calibration-{name}-{i}")
    # A prompt chunk alone in a step, on each variant: big GEMMs, where the execution paths differ least.
    prefills: dict[str, list[float]] = {name: [] for name in order}
    for repeat in range(PROMPT_REPEATS):
        for name, engine in engines.items():
            # NOTE: a prompt of its own (no prefix-cache hit): every token is computed
            prompt = [(11 * repeat + 5 * j + 3) % (vocab - 1) + 1 for j in range(chunk)]
            engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True), request_id=f"prefill-{name}-{repeat}")
            engine.step()
            prefills[name].append(timers[name].last_forward_s)
            engine.abort(f"prefill-{name}-{repeat}")
    timed_s = time.perf_counter() - started
    numeric = [v.name for v in variants if v.changes_numbers and v.name in engines]
    accuracy: dict[str, dict[str, Any]] = {}
    if with_accuracy and numeric:
        try:
            measured = measure_accuracy(engines, run_path, numeric, loaded.tokenizer, vocab)
            accuracy = {name: a.to_dict() for name, a in measured.items()}
        except (ValueError, RuntimeError) as exc:
            failed.update({name: f"accuracy not measured: {type(exc).__name__}: {exc}" for name in numeric})
    device = str(engines[run_path].config.device)
    cost = time.perf_counter() - started
    return StepCalibration(model=config.model, dtype=str(config.dtype), device=device, context=context,
                           run_path=run_path, batches=list(batches), step_s=step_s, forward_s=forward_s,
                           repeats=repeats, cost_s=cost, measured_at=time.time(),
                           prefill_forward_s={name: min(t) for name, t in prefills.items()}, prefill_tokens=chunk,
                           variants={name: changes[name] for name in order}, accuracy=accuracy or None,
                           variant_batches={name: b for name, b in timed_at.items() if b != list(batches)} or None,
                           temperature=SAMPLING_TEMPERATURE,
                           failed=failed or None, accuracy_s=cost - timed_s,
                           method=(f"best of {repeats} decode steps per variant and batch size, variants interleaved, "
                                   f"one {chunk}-token prompt chunk each, "
                                   f"in the server process before the load ({cost:.1f} s, {len(order)} variants)"))


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
