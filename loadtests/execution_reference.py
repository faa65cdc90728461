"""For ``servescope load``: servescope's optimized path timed on the target's model at the batch its clients saw.

The outside view has no step timer; what it has is the time per output token. When the target runs
on this machine and its model is one servescope can build (``probes.model_shape.resolve_model_shape``
knows it), the optimized path's decode step on the same model, at the number of streams the client
saw decoding at once (output tok/s x TPOT) and their mean context, is the step the server could
reach here. It is timed after the load, with nothing of ours running, into ``execution_reference.json``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from probes.execution_paths import EXECUTION_REFERENCE_NAME, OPTIMIZED, PathTiming, measure_paths
from probes.model_shape import resolve_model_shape
from probes.run_dir import RunDirectory

# (batch, context) -> a callable that times one decode step of the target, in seconds
TargetStep = Callable[[int, int], Callable[[], float]]


def measure_reference(run_dir: Path, model: str | None, target_step: TargetStep, num_threads: int | None = None,
                      num_steps: int = 12) -> PathTiming | None:
    """Time the target and the optimized path in turns for the point in ``run_dir``; None when it cannot be known.

    ``target_step(batch, context)`` returns a callable that times one decode step of the target
    (see :func:`http_target_step`).
    """
    from reports.dataset import RunDataset
    from reports.measures import client_measures

    if model is None or resolve_model_shape(model) is None:
        return None
    data = RunDataset.load(run_dir)
    client = client_measures(data)
    if client is None or not client.decoding_streams:
        return None
    ok = data.latencies[data.latencies["is_ok"].astype(bool)]
    context = max(1, round(float(ok["num_prompt_tokens"].mean()) + float(ok["num_output_tokens"].mean()) / 2))
    batch = max(1, round(client.decoding_streams))
    timing = measure_paths(model, batch, context, paths=(OPTIMIZED,), num_threads=num_threads, num_steps=num_steps,
                           target=target_step(batch, context))
    RunDirectory(run_dir).save(EXECUTION_REFERENCE_NAME, timing)
    return timing


def http_target_step(url: str, model: str, api_key: str | None = None, ignore_eos: bool = True,
                     num_tokens: int = 64) -> TargetStep:
    """Time a target over HTTP: ``batch`` concurrent streams of ``num_tokens`` tokens; one step = their median
    time per output token after the first (from the usage count, as a server may merge tokens into one chunk).

    NOTE: the prompt is ``context`` repeated words, about a token each on a BPE vocabulary; the steps
    after the first token are decode steps whatever the prompt's exact length.
    """
    import httpx

    from loadtests.load_context import request_body

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def make(batch: int, context: int) -> Callable[[], float]:
        body = request_body(model, "completions", " ".join(["hello"] * context), num_tokens, ignore_eos)

        def stream(client: httpx.Client) -> float | None:
            """One request's time per output token after the first: (finish - first chunk) / (tokens - 1)."""
            first = finish = None
            num_tokens_out = 0
            with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as response:
                response.raise_for_status()
                for line in _sse_lines(response):
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    now = time.perf_counter()
                    for choice in chunk.get("choices") or []:
                        first = first if first is not None else now
                        if choice.get("finish_reason"):
                            finish = now
                    num_tokens_out = (chunk.get("usage") or {}).get("completion_tokens") or num_tokens_out
            if first is None or finish is None or num_tokens_out < 3 or finish <= first:
                return None  # NOTE: every token in one chunk (a fast server merges them) times nothing
            return (finish - first) / (num_tokens_out - 1)

        def one_round() -> float:
            with httpx.Client(timeout=10.0) as client, ThreadPoolExecutor(batch) as pool:
                steps = [step for step in pool.map(lambda _: stream(client), range(batch)) if step is not None]
            if not steps:
                raise ValueError(f"{url} streamed no request with usage and 3 or more tokens; its decode step "
                                 f"cannot be timed")
            return statistics.median(steps)

        return one_round

    return make


def _sse_lines(response: Any) -> Iterator[str]:
    """The body's lines split at LF only, as SSE frames them.

    NOTE: not ``httpx``'s ``iter_lines``, which also splits at the Unicode line separators that
    ``json.dumps(..., ensure_ascii=False)`` leaves raw inside a token's text (seen with dummy:tiny's
    random tokens), cutting a ``data:`` line in two.
    """
    buffer = b""
    for chunk in response.iter_bytes():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
    if buffer:
        yield buffer.decode("utf-8", errors="replace")
