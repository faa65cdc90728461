"""Labelled llama-server cases: a server configuration and a load whose limit is known by construction, each
checked by a control run with the lever pulled (more slots, a bigger context, fewer users).

    flock /tmp/ss-cpu.lock python -m studies.llama_cases OUT [--cases serial,seats,...] [--binary PATH]

Each case starts ``llama-server`` on the bundled GGUF (``-t 2``, its own flags), runs ``servescope load
--users N`` against it, stops it, and reads ``diagnosis.json``. The served model is aliased
``llama-smollm2``, a name servescope does not load itself: the outside execution reference (servescope's
own server timed on the same weights, minutes per run) is left out; llama-server's own evidence decides.
``tests/peers/test_llama_server.py`` runs these (``tox -e llama``); this script prints them as a table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.run_dir import DIAGNOSIS_NAME, SUMMARY_NAME
from studies.llama_build import llama_server_binary
from studies.servers import GGUF, free_port, stop, wait_ready

ALIAS = "llama-smollm2"
THREADS = 2  # -t: llama-server's threads, one per core of the 2-core box
# Fixed requests, 128 prompt + 64 output tokens; 15 s measured after 3 s of warm-up.
LOAD = ["--tokenizer", "smollm2-135m", "--workload", "fixed", "--max-tokens", "64", "--duration", "15",
        "--warmup", "3", "--stop-timeout", "60"]


@dataclass(frozen=True, slots=True)
class Run:
    """One llama-server configuration under one load, and the verdicts it may read."""

    flags: tuple[str, ...]
    users: int
    expect: tuple[str, ...]  # bottlenecks it must read (one of them)
    deciding: tuple[str, ...] = ()  # rules of which one must have decided it (empty: any)


@dataclass(frozen=True, slots=True)
class Case:
    label: str
    why: str
    run: Run
    control: Run | None = None  # the lever pulled: the case's verdict must be gone
    lever: str = ""

    def runs(self) -> dict[str, Run]:
        return {self.label: self.run, **({f"{self.label}-control": self.control} if self.control else {})}


NOT_BATCHING, NOT_CACHE = ("none", "execution", "cache"), ("none", "execution", "batching")
CASES = {c.label: c for c in (
    Case("serial", "one slot (-np 1), four users: one request at a time, three deferred",
         Run(("-np", "1"), 4, ("batching",), ("server_queue", "server_queue_depth")),
         Run(("-np", "4"), 4, NOT_BATCHING), "more slots: -np 4"),
    Case("seats", "two slots (-np 2), eight users: six deferred for a seat",
         Run(("-np", "2"), 8, ("batching",), ("server_queue", "server_queue_depth")),
         Run(("-np", "8"), 8, NOT_BATCHING), "more slots: -np 8"),
    Case("kv", "four slots sharing a 512-token unified KV pool (-kvu -c 512), four users of 192 tokens each: "
               "\"Context size has been exceeded\" when three or more run at once",
         Run(("-np", "4", "-kvu", "-c", "512"), 4, ("cache",), ("overload_context",)),
         Run(("-np", "4", "-kvu", "-c", "4096"), 4, NOT_CACHE), "a bigger context: -c 4096"),
    Case("compute", "sixteen slots, sixteen users on 2 cores: every request decoding, each several times slower "
                    "than alone, nothing deferred",
         Run(("-np", "16"), 16, ("execution",), ("tpot_over_single_stream",)),
         Run(("-np", "16"), 1, ("none",)), "fewer users: 1"),
    # NOTE: not two users: with these 128-token prompts on 2 cores, one stream's prompt stalls the other's decode and
    # two users served 50-53 output tok/s against about 54 for one alone (2026-12-06): two already fill the device,
    # and execution is their right reading.
    Case("healthy", "eight slots, one user: nothing waits, the stream at its lone speed",
         Run(("-np", "8"), 1, ("none",))),
)}


def run_one(binary: Path, run: Run, out: Path, threads: int = THREADS) -> dict[str, Any]:
    """Start llama-server with ``run.flags``, load it, stop it; the verdict and the evidence it used."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out.mkdir(parents=True, exist_ok=True)
    command = [str(binary), "-m", str(GGUF), "--metrics", "-a", ALIAS, "-t", str(threads), *run.flags,
               "--host", "127.0.0.1", "--port", str(port)]
    log = out.parent / f"{out.name}.server.log"
    load = [sys.executable, "-m", "loadtests.cli", "load", "--target", url, "--users", str(run.users), *LOAD,
            "--out", str(out / "run")]
    with log.open("w") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            wait_ready(proc, url, log)
            started = time.time()
            done = subprocess.run(load, capture_output=True, text=True, timeout=600)
            wall_s = time.time() - started
        finally:
            stop(proc)
    (out / "load.log").write_text(done.stdout + done.stderr)
    diagnosis = json.loads((out / "run" / DIAGNOSIS_NAME).read_text())
    summary = json.loads((out / "run" / SUMMARY_NAME).read_text())["points"][0]["client"] or {}
    deciding = [e for e in diagnosis["evidence"] if e["name"] in diagnosis["deciding"]]
    return {"command": shlex.join([binary.name, *command[1:]]), "users": run.users, "returncode": done.returncode,
            "wall_s": round(wall_s, 1), "bottleneck": diagnosis["bottleneck"], "summary": diagnosis["summary"],
            "deciding": [f"{e['name']}: {e['summary']}" for e in deciding],
            "deciding_names": diagnosis["deciding"], "metrics_read": diagnosis["metrics"].get("metrics_read"),
            "failures": (diagnosis["metrics"].get("failures") or {}),
            "num_requests": summary.get("num_requests"), "num_failed": summary.get("num_failed"),
            "num_retried": summary.get("num_retried"), "tpot_p50_ms": 1000 * summary["tpot_s"]["p50"]
            if summary.get("tpot_s") else None, "output_tok_s": summary.get("output_throughput")}


def is_right(run: Run, result: dict[str, Any]) -> bool:
    return result["bottleneck"] in run.expect and (
        not run.deciding or any(name in result["deciding_names"] for name in run.deciding))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--binary", type=Path, default=None, help="llama-server (default: built and cached)")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="llama-server -t (1 where other work shares the cores: -t 2 waits on a descheduled thread)")
    args = parser.parse_args()
    # NOTE: a timeout's SIGTERM ends the run through run_one's finally, so llama-server is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    binary = args.binary or llama_server_binary()
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                               "binary": str(binary), "load": LOAD, "runs": {}}
    for name in args.cases.split(","):
        for run_name, run in CASES[name].runs().items():
            result = run_one(binary, run, args.out / run_name, args.threads)
            result["right"] = is_right(run, result)
            results["runs"][run_name] = result
            print(json.dumps({run_name: result}, indent=1), flush=True)
            (args.out / "cases.json").write_text(json.dumps(results, indent=1))
    for run_name, r in results["runs"].items():
        print(f"| {run_name} | {r['command'].split(' -m ')[1].split(' --host')[0]} | {r['users']} | "
              f"{r['bottleneck']} | {'right' if r['right'] else 'WRONG'} | {'; '.join(r['deciding'])} |")
    return 0 if all(r["right"] for r in results["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
