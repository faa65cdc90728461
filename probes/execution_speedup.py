"""How much faster the optimized execution path runs a model forward than eager, measured on this machine.

The execution lever's prediction needs this ratio: the step-time model fitted on an eager run knows
its forward time, not what the other path would take. Both paths run the same weights on the same
decode batches, interleaved round by round so that a busy machine slows both alike; the ratio of
their median forward times is written to the run directory as ``execution_speedup.json``.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.run_dir import RunDirectory

SPEEDUP_NAME = "execution_speedup.json"


@dataclass(slots=True)
class ExecutionSpeedup:
    """Median forward seconds of a decode step on each path, and their ratio (eager over optimized)."""

    speedup: float
    eager_forward_s: float
    optimized_forward_s: float
    batch: int
    context_tokens: int
    num_steps: int
    model: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutionSpeedup:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


def read_execution_speedup(path: str | Path) -> tuple[float | None, str]:
    """``(speedup, how it was measured)`` from a run directory, or ``(None, why not)``."""
    record = RunDirectory(path).load(SPEEDUP_NAME, ExecutionSpeedup)
    if record is None:
        return None, ("not predicted: the eager/optimized forward ratio was not measured for this run "
                      "(`servescope diagnose` measures it after an eager run)")
    return record.speedup, (f"optimized forward measured {record.speedup:.2f}x faster than eager on {record.model} "
                            f"(decode batch {record.batch}, {record.context_tokens}-token contexts, "
                            f"{record.num_steps} steps each, interleaved)")


def measure_execution_speedup(recorded: Mapping[str, Any], batch: int, context_tokens: int,
                              decode_steps: int = 6, rounds: int = 3) -> ExecutionSpeedup:
    """Time decode steps of ``batch`` sequences at about ``context_tokens`` each on both paths."""
    from engine import LLMEngine, SamplingParams
    from engine.weights import load_model
    from probes.replay import engine_config

    config = engine_config(recorded, {"host_overhead_ms": 0.0})
    loaded = load_model(config.model, config.torch_dtype, config.seed)
    engines = {mode: LLMEngine(dataclasses.replace(config, execution=mode), loaded)
               for mode in ("eager", "optimized")}
    times: dict[str, list[float]] = {mode: [] for mode in engines}
    rng = random.Random(0)
    vocab = 100
    prompt_len = max(1, min(context_tokens, int(config.max_model_len or 2) - decode_steps - 2))
    for _ in range(rounds):
        for mode, engine in engines.items():
            recorder = _ForwardTimes()
            engine.add_observer(recorder)
            for i in range(batch):
                prompt = [rng.randrange(1, vocab) for _ in range(prompt_len)]
                engine.add_request(prompt, SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True),
                                   request_id=f"speedup-{mode}-{len(times[mode])}-{i}")
            while engine.has_unfinished():
                engine.step()
            engine.remove_observer(recorder)
            times[mode] += recorder.decode_forward_s[-decode_steps:]
    eager, optimized = statistics.median(times["eager"]), statistics.median(times["optimized"])
    return ExecutionSpeedup(speedup=eager / optimized, eager_forward_s=eager, optimized_forward_s=optimized,
                            batch=batch, context_tokens=prompt_len, num_steps=len(times["eager"]),
                            model=config.model)


def write_execution_speedup(path: str | Path, speedup: ExecutionSpeedup) -> Path:
    return RunDirectory(path).save(SPEEDUP_NAME, speedup)


class _ForwardTimes:
    """Forward seconds of the decode-only steps an engine runs."""

    def __init__(self) -> None:
        self.decode_forward_s: list[float] = []

    def on_step(self, stats: Any) -> None:
        if stats.num_prefill_tokens == 0:
            self.decode_forward_s.append(stats.forward_s)

    def on_request_event(self, event: Any) -> None:
        pass
