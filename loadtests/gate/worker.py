"""One side of an A/B gate: a long-lived process that runs rounds of given requests through one engine.

Run as a script (``python -P ab_worker.py``) with the build under test first on ``PYTHONPATH``:
it imports nothing but the standard library and that build's ``engine`` package (its public API:
``EngineConfig`` flags, ``LLMEngine``, ``SamplingParams``, observers), so the same driver loop runs
every build, an older one included. It speaks JSON lines: one request on stdin, one reply on stdout.

- ``{"op": "start", "flags": [...]}``: parse the engine flags with that build's own parser, build the
  engine, reply ``{"engine_file": ..., "config": {...}}``;
- ``{"op": "round", "items": [[prompt_token_ids, max_tokens], ...], "concurrency": C}``: keep ``C``
  requests in flight until all are done, reply ``{"elapsed_s", "cpu_s", "num_output_tokens", "steps": {column: [...]}}``
  (wall and this process's CPU seconds);
- any failure replies ``{"error": "..."}``; end of stdin ends the process.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from collections import deque
from typing import Any


class _FlagError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _FlagError(message)


class _StepRecorder:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def on_step(self, stats: Any) -> None:
        self.rows.append(stats)

    def on_request_event(self, event: Any) -> None:
        pass


class Side:
    """The engine of one side and its closed-loop driver."""

    def __init__(self) -> None:
        self.engine: Any = None

    def start(self, flags: list[str]) -> dict[str, Any]:
        import engine
        from engine import LLMEngine
        from engine.flags import add_engine_args, engine_config_from_args

        parser = _Parser(prog="engine flags", add_help=False)
        add_engine_args(parser)
        try:
            config = engine_config_from_args(parser.parse_args(flags))
        except _FlagError as exc:
            raise ValueError(f"bad engine flags {' '.join(flags)!r}: {exc}") from None
        self.engine = LLMEngine(config)
        return {"engine_file": engine.__file__, "config": dataclasses.asdict(self.engine.config)}

    def run_round(self, items: list[list[Any]], concurrency: int) -> dict[str, Any]:
        from engine import SamplingParams

        engine = self.engine
        if engine is None:
            raise ValueError("round before start")
        recorder = _StepRecorder()
        pending = deque(items)
        in_flight = num_output = 0
        gc.collect()
        engine.add_observer(recorder)
        start, start_cpu = time.perf_counter(), time.process_time()
        while pending or engine.has_unfinished():
            while pending and in_flight < concurrency:
                prompt_token_ids, max_tokens = pending.popleft()
                engine.add_request(prompt_token_ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
                in_flight += 1
            for out in engine.step():
                if out.finished:
                    in_flight -= 1
                    num_output += len(out.token_ids)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        engine.remove_observer(recorder)
        columns = [f.name for f in dataclasses.fields(recorder.rows[0])] if recorder.rows else []
        steps = {name: [getattr(row, name) for row in recorder.rows] for name in columns}
        return {"elapsed_s": elapsed, "cpu_s": cpu, "num_output_tokens": num_output, "steps": steps}


def main() -> int:
    # NOTE: replies own the real stdout; anything else the build prints goes to stderr.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    side = Side()
    for line in sys.stdin:
        message = json.loads(line)
        try:
            if message["op"] == "start":
                reply = side.start(message["flags"])
            elif message["op"] == "round":
                reply = side.run_round(message["items"], message["concurrency"])
            else:
                raise ValueError(f"unknown op {message['op']!r}")
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)}
        replies.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
