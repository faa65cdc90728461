"""Our load's client against llama-server, beside the official ``openai`` client, on the same server and prompts.

    flock /tmp/ss-cpu.lock python -m studies.llama_client_check OUT [--requests 1000] [--users 1,4,16,32]
        [--slots 4] [--binary PATH] [--openai-retries 0,2] [--threads 2]

One llama-server (``-np SLOTS -t THREADS``, the bundled GGUF) serves every run. At each concurrency the ``openai``
client (httpx) first sends REQUESTS streaming requests from that many threads sharing one client, twice: with
its retries off (``max_retries=0``) and at its default (2) (``--openai-retries``: which of the two); then ``servescope load --users N`` runs for the
time the first took, with 15% more, so that it sends at least as many. Every request is the fixed workload's
(128 prompt tokens, 8 output tokens, the same prompts). Counted: requests, failures by kind, and for servescope
the requests sent again because their pooled connection closed before any answer (loadtests.client.stream_client).
Results go to ``OUT/client_check.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from loadtests.plan import read_plan
from studies.llama_build import llama_server_binary
from studies.llama_cases import ALIAS, THREADS
from studies.servers import GGUF, free_port, stop, wait_ready

MAX_TOKENS = 8
LOAD = ["--tokenizer", "smollm2-135m", "--workload", "fixed", "--max-tokens", str(MAX_TOKENS), "--warmup", "0",
        "--stop-timeout", "60"]


def openai_run(url: str, prompts: list[str], num_requests: int, users: int, max_retries: int) -> dict[str, Any]:
    """``num_requests`` streamed completions from ``users`` threads sharing one ``openai.OpenAI`` client."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=max_retries, timeout=300.0)
    left = [num_requests]
    lock = threading.Lock()
    errors: collections.Counter[str] = collections.Counter()
    ok = [0]

    def user() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
                prompt = prompts[left[0] % len(prompts)]
            try:
                stream = client.completions.create(model=ALIAS, prompt=prompt, max_tokens=MAX_TOKENS, stream=True,
                                                   extra_body={"ignore_eos": True})
                for _ in stream:
                    pass
                with lock:
                    ok[0] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted by its kind
                cause = exc.__cause__ or exc.__context__
                with lock:
                    errors[f"{type(exc).__name__}" + (f" ({type(cause).__name__}: {cause})" if cause else "")] += 1

    started = time.time()
    # NOTE: daemon threads: a SIGTERM (a timeout) ends the run without waiting for the requests left.
    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    return {"num_requests": num_requests, "num_ok": ok[0], "num_failed": sum(errors.values()),
            "errors": dict(errors), "wall_s": round(time.time() - started, 1)}


def servescope_run(url: str, users: int, duration_s: float, out: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "loadtests.cli", "load", "--target", url, "--users", str(users),
            "--duration", f"{duration_s:.0f}", *LOAD, "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    from loadtests.client.table import load_client_requests
    from reports.failures import failure_counts

    rows = load_client_requests(out)
    counts = failure_counts(rows)
    return {"num_requests": len(rows), "num_ok": int(rows["is_ok"].sum()), "num_failed": counts.num_failed,
            "errors": counts.by_kind, "num_retried": int((rows["num_retries"] > 0).sum()),
            "returncode": done.returncode, "duration_s": round(duration_s)}


def check_clients(binary: Path, work: Path, num_requests: int = 1000, concurrencies: tuple[int, ...] = (1, 4, 16, 32),
                  slots: int = 4, openai_retries: tuple[int, ...] = (0, 2), threads: int = THREADS) -> list[dict[str, Any]]:
    """Each concurrency's counts for the openai client (retries off, default) and for servescope's load."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(binary), "-m", str(GGUF), "--metrics", "-a", ALIAS, "-t", str(threads), "-np", str(slots),
               "--host", "127.0.0.1", "--port", str(port)]
    rows: list[dict[str, Any]] = []
    with (work / "llama-server.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(proc, url, work / "llama-server.log")
            # NOTE: the fixed workload's prompts, as servescope's plan writes them: both clients send the same text.
            servescope_run(url, 1, 2, work / "prompts")
            prompts = [item.prompt for item in read_plan(work / "prompts" / "workload.jsonl")]
            for users in concurrencies:
                runs = {f"openai_{retries}_retries": openai_run(url, prompts, num_requests, users, max_retries=retries)
                        for retries in openai_retries}
                ours = servescope_run(url, users, max(r["wall_s"] for r in runs.values()) * 1.15,
                                      work / f"servescope-{users}")
                rows.append({"users": users, "slots": slots, **runs, "servescope": ours})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            stop(proc)
    (work / "client_check.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--users", default="1,4,16,32")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--binary", type=Path, default=None)
    parser.add_argument("--openai-retries", default="0,2", help="the openai client's max_retries, one run each")
    parser.add_argument("--threads", type=int, default=THREADS, help="llama-server -t")
    args = parser.parse_args()
    # NOTE: a timeout's SIGTERM ends the run through the finally blocks, so llama-server is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    retries = tuple(int(r) for r in args.openai_retries.split(","))
    rows = check_clients(args.binary or llama_server_binary(), args.out, args.requests,
                         tuple(int(u) for u in args.users.split(",")), args.slots, retries, args.threads)
    heads = [f"openai, max_retries={r}: failed / sent (s)" for r in retries]
    print(f"\n| users ({args.slots} slots) | {' | '.join(heads)} | servescope load: failed / sent (sent again) (s) |\n"
          f"|{'---|' * (len(retries) + 2)}")
    for r in rows:
        c = r["servescope"]
        cells = [f"{r[f'openai_{n}_retries']['num_failed']} / {r[f'openai_{n}_retries']['num_requests']} "
                 f"({r[f'openai_{n}_retries']['wall_s']})" for n in retries]
        print(f"| {r['users']} | {' | '.join(cells)} | {c['num_failed']} / {c['num_requests']} ({c['num_retried']}) "
              f"({c['duration_s']}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
