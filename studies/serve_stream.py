"""One stream through ``servescope serve`` beside the same engine stepped in-process: what the server adds.

Starts one server per ``--serve`` spec (all at once, idle between their turns), then, round by round
and alternating the order, streams one ``/v1/completions`` request (``ignore_eos``) from each server
with a bare HTTP client (stdlib, no Locust) and times one request on an in-process engine of each
``--engine`` spec. TPOT is the mean gap between the second and the last token; the gap between what
a client of the server sees and the in-process step is what the serving path adds per token.
A spec's leading ``NAME=VALUE`` words are environment variables for that server, e.g.
``--serve "OMP_WAIT_POLICY=PASSIVE --dtype bfloat16"``; ``SERVESCOPE_BIN=PATH`` runs another build's
``servescope`` (e.g. main's, to compare two builds side by side). Run it under the exclusive lock::

    flock /tmp/ss-cpu.lock .venv/bin/python -m studies.serve_stream --rounds 5 \\
        --serve "" --engine ""

``--users N`` streams N requests at once from each server instead (output tok/s and TPOT p50).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from studies.single_stream import PROMPT, _engine, engine_run

SERVESCOPE = shutil.which("servescope") or str(Path(sys.executable).parent / "servescope")


def split_spec(spec: str) -> tuple[dict[str, str], str]:
    """``"A=1 B=2 --flag x"`` -> ``({"A": "1", "B": "2"}, "--flag x")``."""
    words = shlex.split(spec)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, shlex.join(words)


class ServerProc:
    """``servescope serve`` on a free port (``--port 0 --port-file``), stopped by :meth:`stop`."""

    def __init__(self, spec: str, model: str, workdir: Path, index: int) -> None:
        env, flags = split_spec(spec)
        self.spec = spec
        port_file = workdir / f"port.{index}.json"
        self.log = workdir / f"server.{index}.log"
        argv = [env.pop("SERVESCOPE_BIN", SERVESCOPE), "serve", "--model", model, "--port", "0", "--port-file", str(port_file),
                "--log-level", "warning", *shlex.split(flags)]
        self.proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=self.log.open("w"),  # noqa: SIM115
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {spec!r} did not start; see {self.log}")
            time.sleep(0.2)
        self.port = int(json.loads(port_file.read_text())["port"])
        while True:  # the port is bound before the engine is loaded; /health answers once it is
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {spec!r} never became healthy; see {self.log}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def stream_once(port: int, model: str, max_tokens: int) -> list[float]:
    """Arrival times (perf_counter) of each SSE event that carries text."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True, "temperature": 0})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    stamps: list[float] = []
    while True:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data: {") and b'"text":""' not in line.replace(b" ", b""):
            stamps.append(time.perf_counter())
    conn.close()
    return stamps


def tpot(stamps: list[float]) -> float:
    return (stamps[-1] - stamps[1]) / (len(stamps) - 2)


def streams_at_once(port: int, model: str, max_tokens: int, users: int) -> tuple[float, float]:
    """``users`` concurrent streams: (output tok/s over the whole batch, TPOT p50 over the streams)."""
    results: list[list[float]] = [[] for _ in range(users)]

    def one(i: int) -> None:
        results[i] = stream_once(port, model, max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(users)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    return sum(len(s) for s in results) / elapsed, statistics.median(tpot(s) for s in results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", action="append", default=[], help="[ENV=V ...] serve flags of one server (repeatable)")
    p.add_argument("--engine", action="append", default=[], help="engine flags of one in-process engine (repeatable)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--users", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="serve_stream."))
    servers: list[ServerProc] = []
    try:
        for i, spec in enumerate(args.serve):
            servers.append(ServerProc(spec, args.model, workdir, i))
        loaded: dict = {}
        engines = {f"in-process {flags}".strip(): _engine(f"--model {args.model} {flags}", loaded)
                   for flags in args.engine}
        served_model = args.model

        def run_server(server: ServerProc) -> tuple[float, float]:
            if args.users == 1:
                stamps = stream_once(server.port, served_model, args.max_tokens)
                return 1 / tpot(stamps), tpot(stamps)
            return streams_at_once(server.port, served_model, args.max_tokens, args.users)

        prompt_ids = next(iter(loaded.values())).tokenizer.encode(PROMPT) if loaded else []
        names = [f"serve {s.spec}".strip() for s in servers] + list(engines)

        def run(name: str) -> tuple[float, float]:
            if name in engines:
                seconds, _ = engine_run(engines[name], prompt_ids, args.max_tokens)
                return 1 / seconds, seconds
            return run_server(servers[names.index(name)])

        for name in names:  # warm-up
            run(name)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                results[name].append(run(name))
        report = {}
        print(f"{'configuration':<60} {'tok/s':>7} {'TPOT p50 ms':>11}")
        for name in names:
            tok_s = statistics.median(x for x, _ in results[name])
            tpot_s = statistics.median(t for _, t in results[name])
            report[name] = {"tok_s": tok_s, "tpot_p50_s": tpot_s, "runs": results[name]}
            print(f"{name:<60} {tok_s:7.1f} {tpot_s * 1e3:11.1f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"users": args.users, "max_tokens": args.max_tokens,
                                                   "rounds": args.rounds, "results": report}, indent=2))
    finally:
        for server in servers:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
