"""For ``servescope load``: the target's decode step against servescope's own, on the same weights, in turns.

The outside view has no step timer; what it has is the time per output token. When the target runs
on this machine and serves weights servescope can load (a ``--model`` name, a GGUF file, an HF
directory), ``servescope serve`` is started on the same weights after the load, and both servers'
decode steps are timed by the same HTTP client, in turns, at the number of streams the client saw
decoding at once (output tok/s x TPOT) and their mean context, into ``execution_reference.json``.
Both figures then carry the same serving work (HTTP, streaming, the timing client on the same
cores), so what differs is what each server does per step.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from probes.execution_paths import OPTIMIZED, TARGET, PathTiming, measure_paths
from probes.model_shape import resolve_model_shape
from probes.run_dir import EXECUTION_REFERENCE_NAME, RunDirectory

# (batch, context) -> a callable that times one decode step of the target, in seconds
TargetStep = Callable[[int, int], Callable[[], float]]
REFERENCE_BOOT_S = 300.0  # the reference server's model load and weight packing
SERVED_ROUNDS = 5  # rounds per server when both are timed over HTTP (each round streams 64 tokens)


# A stream is timed only if its tokens arrived in at least this many separate deliveries (gaps over
# BURST_GAP_S); fewer, and the client saw bursts, not steps.
BURST_GAP_S = 2e-4
MIN_DELIVERIES = 4


def reference_weights(served_model: str | None) -> str | None:
    """The ``--model`` that loads the weights the target serves, or None when servescope cannot tell.

    Known names and ``dummy:`` models, a ``.gguf`` file, an HF directory, and ``transformers serve``'s
    ``DIR:FILE.gguf`` form for a local GGUF.
    """
    if served_model is None:
        return None
    if resolve_model_shape(served_model) is not None:
        return served_model
    candidates = [served_model]
    if ":" in served_model:
        directory, _, name = served_model.rpartition(":")
        candidates.append(str(Path(directory) / name))
    for candidate in candidates:
        path = Path(candidate).expanduser()
        if (path.is_file() and path.suffix == ".gguf") or (path.is_dir() and (path / "config.json").is_file()):
            return str(path)
    return None


def measure_reference(run_dir: Path, model: str | None, target_step: TargetStep, num_threads: int | None = None,
                      num_steps: int = 12, reference_step: TargetStep | None = None,
                      reference: str = "") -> PathTiming | None:
    """Time the target and servescope's optimized path in turns for the point in ``run_dir``; None when it
    cannot be known.

    ``target_step(batch, context)`` returns a callable that times one decode step of the target
    (see :func:`http_target_step`). ``reference_step``, when given, times servescope's own server the
    same way (``reference`` says what it is); otherwise the optimized engine is stepped in this process.
    """
    from reports.dataset import RunDataset
    from reports.measures import client_measures

    if model is None or (reference_step is None and resolve_model_shape(model) is None):
        return None
    data = RunDataset.load(run_dir)
    client = client_measures(data)
    if client is None or not client.decoding_streams:
        return None
    ok = data.latencies[data.latencies["is_ok"].astype(bool)]
    context = max(1, round(float(ok["num_prompt_tokens"].mean()) + float(ok["num_output_tokens"].mean()) / 2))
    batch = max(1, round(client.decoding_streams))
    if reference_step is None:
        timing = measure_paths(model, batch, context, paths=(OPTIMIZED,), num_threads=num_threads,
                               num_steps=num_steps, target=target_step(batch, context))
    else:
        timing = _time_in_turns(model, batch, context, target_step(batch, context), reference_step(batch, context),
                                num_steps, reference)
    RunDirectory(run_dir).save(EXECUTION_REFERENCE_NAME, timing)
    return timing


def measure_served_reference(run_dir: Path, model: str, target_step: TargetStep, url_step: Callable[[str], TargetStep],
                             num_threads: int | None = None) -> PathTiming | None:
    """Start ``servescope serve`` on ``model``'s weights (float32, optimized; its own defaults otherwise),
    then time it and the target in turns (:func:`measure_reference`); the server is stopped after."""
    from loadtests.run.server_process import ServerProcess

    argv = ["--model", model, *(["--num-threads", str(num_threads)] if num_threads else [])]
    with tempfile.TemporaryDirectory(prefix="servescope-reference-") as scratch:
        server = ServerProcess(Path(scratch), argv, probed=False)
        with server:
            server.wait_healthy(REFERENCE_BOOT_S)
            return measure_reference(run_dir, model, target_step, num_steps=SERVED_ROUNDS,
                                     reference_step=url_step(server.url),
                                     reference=f"`servescope serve --model {model}` (float32, optimized)")


def _time_in_turns(model: str, batch: int, context: int, target: Callable[[], float], reference: Callable[[], float],
                   num_rounds: int, label: str) -> PathTiming:
    """Best of ``num_rounds`` for each, alternating which goes first, so a busy machine slows both alike."""
    timings: dict[str, list[float]] = {OPTIMIZED: [], TARGET: []}
    untimed: dict[str, str] = {}
    for round_index in range(num_rounds):
        turns = ((OPTIMIZED, reference), (TARGET, target))
        for name, step in turns if round_index % 2 == 0 else reversed(turns):
            try:
                timings[name].append(step())
            except ValueError as exc:  # a round whose streams could not be timed; the others still count
                untimed[name] = str(exc)
    for name, times in timings.items():
        if not times:
            raise ValueError(f"no round of {num_rounds} could time the {name} side: {untimed.get(name)}")
    return PathTiming(model=model, dtype="float32", device="cpu", batch=batch, context=context, run_path=None,
                      step_s={name: min(t) for name, t in timings.items()}, num_steps=num_rounds,
                      measured_at=time.time(),
                      method=(f"best of {num_rounds} rounds per server, in turns, after the load, both timed by the "
                              f"same HTTP client: the target and {label} on the same weights"))


def http_target_step(url: str, model: str, api_key: str | None = None, ignore_eos: bool = True,
                     num_tokens: int = 64) -> TargetStep:
    """Time a target over HTTP: ``batch`` concurrent streams of ``num_tokens`` tokens; one step = their median
    time per output token after the first (from the usage count, as a server may merge tokens into one chunk).

    NOTE: the prompt is ``context`` repeated words, about a token each on a BPE vocabulary; the steps
    after the first token are decode steps whatever the prompt's exact length.
    """
    import httpx

    from loadtests.client.load_context import request_body

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def make(batch: int, context: int) -> Callable[[], float]:
        body = request_body(model, "completions", " ".join(["hello"] * context), num_tokens, ignore_eos)

        def stream() -> float | None:
            """One request's time per output token after the first: (finish - first chunk) / (tokens - 1).

            NOTE: each on a connection of its own, closed after it: a pooled one may be one the server closes
            after every stream (llama-server does), and a request sent on it would be lost.
            """
            finish = None
            num_tokens_out = 0
            arrivals: list[float] = []  # when each token-bearing chunk came
            with httpx.Client(timeout=10.0) as client, \
                    client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as response:
                response.raise_for_status()
                for line in _sse_lines(response):
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    now = time.perf_counter()
                    for choice in chunk.get("choices") or []:
                        arrivals.append(now)
                        if choice.get("finish_reason"):
                            finish = now
                    num_tokens_out = (chunk.get("usage") or {}).get("completion_tokens") or num_tokens_out
            if not arrivals or finish is None or num_tokens_out < 3 or finish <= arrivals[0]:
                return None  # NOTE: every token in one chunk (a fast server merges them) times nothing
            deliveries = 1 + sum(1 for a, b in zip(arrivals, arrivals[1:], strict=False) if b - a > BURST_GAP_S)
            if deliveries < MIN_DELIVERIES:
                # NOTE: the tokens came in a few bursts (held back in the server, e.g. a fresh server's first
                # stream, or in the network): their gaps time the bursts, not the steps (seen: 5 us "steps").
                return None
            return (finish - arrivals[0]) / (num_tokens_out - 1)

        def one_round() -> float:
            with ThreadPoolExecutor(batch) as pool:
                steps = [step for step in pool.map(lambda _: stream(), range(batch)) if step is not None]
            if not steps:
                raise ValueError(f"{url} streamed no request with usage, 3 or more tokens and at least "
                                 f"{MIN_DELIVERIES} separate deliveries; its decode step cannot be timed")
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
