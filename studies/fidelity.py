"""Client fidelity: servescope load and GuideLLM, one after the other, against ``guidellm mock-server``
(truth: TTFT 100 ms, ITL 10 ms, 32 tokens). Run in an environment with both installed (``tox -e peers``):
``python -m studies.fidelity DIR 16,64 1,2 20`` (concurrencies, servescope worker processes, seconds).

Like with like: GuideLLM's ``inter_token_latency_ms`` is a per-request mean, (last token - first token) /
(tokens - 1), which servescope calls TPOT; servescope's ITL is every gap between chunks. Both are printed.
Where ``dumpcap``/``tshark`` are installed (root, Debian's ``tshark``), every client run is also captured
on the loopback interface and read back (studies/wire.py): the same figures as the wire saw them,
so what a client adds to a latency is its figure minus the wire's.

Beside each client's figures: the mock server's own CPU (its busiest second-long windows' median, as
a share of one core: a mock server that is saturated no longer keeps its promised timing) and, for
servescope, its load workers' own health (summary.json's ``workers``: CPU and event-loop lag).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pandas as pd
import psutil

from engine.weights import load_model
from probes.run_dir import SUMMARY_NAME, RunDirectory
from reports.summary import RunSummary
from studies.wire import Capture, WireTimings, read_capture

PEERS = Path(shutil.which("guidellm") or "guidellm").parent
SS = Path(shutil.which("servescope") or "servescope").parent
if len(sys.argv) != 5:
    sys.exit(f"usage: python -m studies.fidelity DIR CONCURRENCIES PROCESSES SECONDS\n\n{__doc__}")
work = Path(sys.argv[1])
work.mkdir(parents=True, exist_ok=True)
conc = [int(c) for c in sys.argv[2].split(",")]
procs = [int(p) for p in sys.argv[3].split(",")]
dur = float(sys.argv[4])
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
url = f"http://127.0.0.1:{port}"
tok = work / "tok"
if not tok.exists():
    load_model("dummy:tiny").tokenizer.save_pretrained(tok)
mock = subprocess.Popen([PEERS / "guidellm", "mock-server", "--host", "127.0.0.1", "--port", str(port), "--model", "dummy:tiny",
                         "--ttft-ms", "100", "--itl-ms", "10", "--output-tokens", "32"],
                        stdout=(work / "mock.log").open("w"), stderr=subprocess.STDOUT)  # noqa: SIM115


class CpuWatch:
    """Samples a process tree's CPU share of one core every second on a thread, while a client runs."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.shares: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _cpu(self) -> float:
        total = 0.0
        for p in [self.root, *self.root.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        last_t, last_cpu = time.monotonic(), self._cpu()
        while not self._stop.wait(1.0):
            now, cpu = time.monotonic(), self._cpu()
            self.shares.append((cpu - last_cpu) / (now - last_t))
            last_t, last_cpu = now, cpu

    def __enter__(self) -> "CpuWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def busy_median(self) -> float:
        """The median of the busier half of the seconds sampled (the run, not its start-up and tail)."""
        busy = sorted(self.shares)[len(self.shares) // 2:]
        return busy[len(busy) // 2] if busy else float("nan")


class NoCapture:
    def __enter__(self) -> "NoCapture":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def captured(name: str) -> "Capture | NoCapture":
    return Capture(work / f"{name}.pcapng", port) if Capture.available() else NoCapture()


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def wire_figures(name: str, window: tuple[float, float]) -> "WireTimings | None":
    """The capture's timings of the requests sent inside the client's own measured window (epoch s)."""
    path = work / f"{name}.pcapng"
    return read_capture(path, port, window) if path.exists() else None


def measured_window(run_dir: Path) -> tuple[float, float]:
    """The first and last send of servescope's measured (not warm-up) requests."""
    rows = pd.read_parquet(run_dir / "client_requests.parquet")
    sent = rows.loc[~rows["is_warmup"], "send_time"]
    return float(sent.min()), float(sent.max()) + 1e-3


env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
try:
    for _ in range(120):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    rows = []
    for c in conc:
        for p in procs:
            out = work / f"ss-c{c}-p{p}"
            with CpuWatch(mock.pid) as watch, captured(out.name):
                subprocess.run([SS / "servescope", "load", "--target", url, "--served-model", "dummy:tiny", "--tokenizer", "dummy:tiny",
                                "--users", str(c), "--duration", str(dur), "--warmup", "3", "--workload", "fixed",
                                "--max-tokens", "32", "--no-ignore-eos", "--processes", str(p), "--out", str(out)],
                               check=True, env=env, stdout=(work / f"ss-c{c}-p{p}.log").open("w"), stderr=subprocess.STDOUT, timeout=600)  # noqa: SIM115
            # The measures servescope itself reports for the point (reports.measures.client_measures).
            (point,) = RunDirectory(out).load(SUMMARY_NAME, RunSummary).points
            cm = point.client
            own = "; ".join(f"{w.worker} CPU {w.cpu_share_p50:.0%}, loop lag p95 {1000 * w.loop_lag_p95_s:.1f} ms"
                            for w in point.workers)
            rows.append((f"servescope load --processes {p}", c, cm.request_throughput,
                         1000 * cm.ttft_s["p50"], 1000 * cm.ttft_s["p99"], 1000 * cm.itl_s["p50"],
                         1000 * cm.itl_s["p99"], 1000 * cm.tpot_s["p50"], 1000 * cm.tpot_s["p99"], cm.num_ok,
                         watch.busy_median(), wire_figures(out.name, measured_window(out)),
                         f"{own}; warnings: {[w.kind for w in point.warnings]}"))
            print(rows[-1][:11], flush=True)
        g = work / f"gl-c{c}"
        g.mkdir(exist_ok=True)
        scenario = {"spec": {
            "backend": {"kind": "openai_http", "target": url, "model": "dummy:tiny", "request_format": "/v1/chat/completions"},
            "profile": {"kind": "concurrent", "streams": [c]},
            "data": [{"kind": "synthetic_text", "prompt_tokens": 64, "output_tokens": 32}],
            "tokenizer": {"kind": "huggingface_auto", "model": str(tok)},
            "constraints": [{"kind": "max_duration", "seconds": dur + 3}],
            "outputs": [{"kind": "json", "path": str(g / "out.json")}]}}
        (g / "scenario.json").write_text(json.dumps(scenario))
        with CpuWatch(mock.pid) as watch, captured(g.name):
            subprocess.run([PEERS / "guidellm", "run", "--scenario", str(g / "scenario.json"), "--disable-console-interactive"],
                           check=True, env=env, cwd=g, stdout=(g / "log").open("w"), stderr=subprocess.STDOUT, timeout=600)  # noqa: SIM115
        (b,) = json.loads((g / "out.json").read_text())["benchmarks"]
        mt = b["metrics"]
        def pct(name, q, mt=mt):
            d = mt[name]["successful"]
            return d.get("percentiles", {}).get(q) if q != "median" else d.get("median")
        # NOTE: GuideLLM records no per-gap ITL; its inter_token_latency_ms is the per-request mean
        rows.append(("GuideLLM 0.8.1", c, mt["requests_per_second"]["successful"]["mean"],
                     pct("time_to_first_token_ms", "median"), pct("time_to_first_token_ms", "p99"),
                     float("nan"), float("nan"),
                     pct("inter_token_latency_ms", "median"), pct("inter_token_latency_ms", "p99"),
                     mt["request_totals"]["successful"], watch.busy_median(),
                     wire_figures(g.name, (b["start_time"], b["end_time"])), ""))
        print(rows[-1][:11], flush=True)
    print("| client | concurrency | req/s | TTFT p50 / p99 ms | per-gap ITL p50 / p99 ms | per-request ITL "
          "(TPOT) p50 / p99 ms | requests | mock server CPU | client |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.0f} / {r[4]:.0f} | {r[5]:.1f} / {r[6]:.1f} "
              f"| {r[7]:.1f} / {r[8]:.1f} | {r[9]} | {r[10]:.0%} | {r[12]} |")
        wire = r[11]
        if wire is not None:
            print(f"| (wire, {r[0]}) | {r[1]} | {wire.num_requests} requests | "
                  f"{1000 * quantile(wire.ttft_s, .5):.0f} / {1000 * quantile(wire.ttft_s, .99):.0f} "
                  f"| {1000 * quantile(wire.itl_s, .5):.1f} / {1000 * quantile(wire.itl_s, .99):.1f} "
                  f"| {1000 * quantile(wire.tpot_s, .5):.1f} / {1000 * quantile(wire.tpot_s, .99):.1f} "
                  f"| {wire.num_packets} packets, {wire.num_multi_token_packets} with several tokens | | |")
finally:
    mock.kill()
