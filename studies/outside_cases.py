"""Issue 33's outside cases: servers with no ``/metrics`` whose limit is known by construction, read by
``servescope load --target URL`` alone.

    flock /tmp/ss-cpu.lock python -m studies.outside_cases OUT [--cases tf-cb-small,tf-cb-default,ours-overhead]
        [--tf PATH-TO-transformers] [--small-blocks 32]

- ``tf-cb-small``: ``transformers serve --continuous-batching`` with a KV pool of ``--small-blocks`` pages of 16
  tokens (32: three of the fixed workload's requests of 128 + 32 tokens, one at 3x the tokens), under a capacity
  search: the pool holds it, so the verdict must be ``cache`` (the tokens experiment: 3x the tokens per request
  cut the streams decoding at once), not serial or seats.
- ``tf-cb-default``: the same with servescope's default KV budget (364 pages, as ``studies/servers.py``): the
  control, which must not read ``cache``.
- ``ours-overhead``: ``servescope serve --host-overhead-ms 40`` (40 ms of host work in every engine step) under
  ``servescope load --users 6``: it must read ``execution`` from outside (the outside execution reference: the
  target's step against ``servescope serve``'s on the same weights, timed in turns after the load).

Each case starts its server on a free loopback port, runs the load into ``OUT/CASE``, stops the server and reads
``diagnosis.json``; ``OUT/cases.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.run_dir import DIAGNOSIS_NAME
from studies.servers import GGUF, TF_MODEL, free_port, stop, wait_ready

# The fixed workload (128 prompt tokens) with 32 output tokens: 10 pages of 16 tokens a request, 30 at 3x.
LOAD = ["--tokenizer", "smollm2-135m", "--workload", "fixed", "--max-tokens", "32", "--stop-timeout", "60"]
# A capacity search of fixed points (5 s warm-up, 20 s measured), as the worked example in docs/servers.md.
SEARCH = ["--max-users", "8", "--interval", "0", "--warmup", "5", "--duration", "20"]
USERS_RUN = ["--users", "6", "--warmup", "5", "--duration", "20"]
DEFAULT_BLOCKS = 364  # servescope serve's default KV budget in pages of 16 tokens (studies/servers.py's TF_CB_KV)


@dataclass(frozen=True, slots=True)
class Case:
    server: tuple[str, ...]  # {port} filled in
    load: tuple[str, ...]
    expect: tuple[str, ...]  # bottlenecks it may read


def cases(tf: str, small_blocks: int) -> dict[str, Case]:
    tf_serve = (tf, "serve", TF_MODEL, "--dtype", "float32", "--device", "cpu", "--host", "127.0.0.1",
                "--port", "{port}", "--log-level", "warning", "--continuous-batching", "--cb-block-size", "16")
    servescope = str(Path(sys.executable).parent / "servescope")
    return {
        "tf-cb-small": Case((*tf_serve, "--cb-num-blocks", str(small_blocks)), tuple(SEARCH), ("cache",)),
        "tf-cb-default": Case((*tf_serve, "--cb-num-blocks", str(DEFAULT_BLOCKS)), tuple(SEARCH),
                              ("none", "execution", "batching")),
        "ours-overhead": Case((servescope, "serve", "--host", "127.0.0.1", "--port", "{port}", "--log-level",
                               "warning", "--host-overhead-ms", "40"), tuple(USERS_RUN), ("execution",)),
    }


def run_case(name: str, case: Case, out: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [a.replace("{port}", str(port)) for a in case.server]
    load = [sys.executable, "-m", "loadtests.cli", "load", "--target", url, *LOAD, *case.load,
            "--out", str(out / name)]
    log = out / f"{name}.server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    print(f"== {name}: {shlex.join(command)}\n   {shlex.join(load)}", flush=True)
    with log.open("w") as log_file:
        proc = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            ready_s = wait_ready(proc, url, log)
            started = time.time()
            done = subprocess.run(load, capture_output=True, text=True, timeout=1500, env=env)
            wall_s = time.time() - started
        finally:
            stop(proc)
    (out / f"{name}.load.log").write_text(done.stdout + done.stderr)
    path = out / name / DIAGNOSIS_NAME
    diagnosis = json.loads(path.read_text()) if path.exists() else {}
    deciding = [e for e in diagnosis.get("evidence", []) if e["name"] in diagnosis.get("deciding", [])]
    return {"server": shlex.join(command), "load": shlex.join(load[2:]), "ready_s": round(ready_s, 1),
            "wall_s": round(wall_s, 1), "returncode": done.returncode, "bottleneck": diagnosis.get("bottleneck"),
            "confidence": diagnosis.get("confidence_label"), "summary": diagnosis.get("summary"),
            "deciding": [f"{e['name']}: {e['summary']}" for e in deciding],
            "right": diagnosis.get("bottleneck") in case.expect}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", default="tf-cb-small,tf-cb-default,ours-overhead")
    parser.add_argument("--tf", default=str(Path(sys.executable).parent / "transformers"),
                        help="the transformers CLI (transformers 5.x with [serving])")
    parser.add_argument("--small-blocks", type=int, default=32)
    args = parser.parse_args()
    # NOTE: a timeout's SIGTERM ends the run through run_case's finally, so the server is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    known = cases(args.tf, args.small_blocks)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "gguf": str(GGUF),
                               "runs": {}}
    for name in args.cases.split(","):
        results["runs"][name] = run_case(name, known[name], args.out)
        print(json.dumps({name: results["runs"][name]}, indent=1), flush=True)
        (args.out / "cases.json").write_text(json.dumps(results, indent=1))
    for name, r in results["runs"].items():
        print(f"| {name} | {r['bottleneck']} ({r['confidence']}) | {'right' if r['right'] else 'WRONG'} | "
              f"{'; '.join(r['deciding'])} |")
    return 0 if all(r["right"] for r in results["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
