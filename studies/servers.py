"""Real servers side by side: ``servescope serve``, ``transformers serve`` (with and without
``--continuous-batching``), llama-cpp-python's server and llama.cpp's own ``llama-server`` on the same
SmolLM2-135M GGUF, each loaded by the same ``servescope load --sweep users=...`` command, one server after
the other.

    flock /tmp/ss-cpu.lock python -m studies.servers OUT [--servers ours,tf,tf-cb,llama,llama-server]
        [--users 1,4,8,16] [--duration 30] [--warmup 5] [--max-tokens 48]
        [--ours NAME='serve flags' ...]

Each server gets a free loopback port and is stopped before the next starts. Per server this prints
and writes (``OUT/servers.json``): its version and command, the request fields servescope's probe
dropped for it, whether it serves ``/metrics``, output tok/s and TPOT p50 per point (from the run's
``summary.json``) and servescope's diagnosis of it (``diagnosis.json``); then ratios of the first
``ours*`` server to every other, point by point. The peers are not installed in the test venv: their
environments default to ``/work/peers/tf`` and ``/work/peers/llama`` (``$PEERS_TF``, ``$PEERS_LLAMA``);
llama-server is ``$SERVESCOPE_LLAMA_SERVER`` or the build ``python -m studies.llama_build`` caches.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.run.target import discover_target, probe_request
from probes.run_dir import DIAGNOSIS_NAME, SUMMARY_NAME

GGUF = Path.home() / ".cache" / "servescope" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TF_ENV = Path(os.environ.get("PEERS_TF", "/work/peers/tf"))
LLAMA_ENV = Path(os.environ.get("PEERS_LLAMA", "/work/peers/llama"))
SERVESCOPE = Path(shutil.which("servescope") or Path(sys.executable).parent / "servescope")
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 30
# transformers serve names a GGUF as `<repo>:<file>.gguf`; a local directory is a repo.
TF_MODEL = f"{GGUF.parent}:{GGUF.name}"
# NOTE: left to size itself on a CPU, HF's paged cache took 14 GB of RSS on a 23 GB machine; it gets
# the KV budget `servescope serve` has by default: 364 pages of 16 tokens (256 MB in float32).
TF_CB_KV = ["--cb-block-size", "16", "--cb-num-blocks", "364"]


@dataclass(slots=True)
class Server:
    """One server to start: its command (``{port}`` filled in), the model name to request, its version."""

    name: str
    label: str
    argv: list[str]
    served_model: str | None  # None: the first /v1/models lists
    version_argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def command(self, port: int) -> list[str]:
        return [a.replace("{port}", str(port)) for a in self.argv]


def servers(ours_variants: dict[str, str]) -> dict[str, Server]:
    """Every server this script knows, by name (``ours`` and each ``--ours`` variant first)."""
    tf_serve = [str(TF_ENV / "bin" / "transformers"), "serve", TF_MODEL, "--dtype", "float32", "--device", "cpu",
                "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"]
    tf_version = [str(TF_ENV / "bin" / "python"), "-c", "import transformers; print(transformers.__version__)"]
    known = {
        "ours": Server("ours", "servescope serve (defaults: float32, optimized)",
                       [str(SERVESCOPE), "serve", "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"],
                       None, [sys.executable, "-c", "import importlib.metadata as m; print(m.version('servescope'))"]),
        "tf": Server("tf", "transformers serve (no continuous batching, float32)", tf_serve, TF_MODEL, tf_version),
        "tf-cb": Server("tf-cb", "transformers serve --continuous-batching (float32)",
                        [*tf_serve, "--continuous-batching", *TF_CB_KV], TF_MODEL, tf_version),
        "llama": Server("llama", "llama-cpp-python server (Q4_1, --n_threads 2)",
                        [str(LLAMA_ENV / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(GGUF),
                         "--n_threads", "2", "--interrupt_requests", "False", "--host", "127.0.0.1",
                         "--port", "{port}"],
                        None, [str(LLAMA_ENV / "bin" / "python"), "-c", "import llama_cpp; print(llama_cpp.__version__)"]),
    }
    # NOTE: where studies/llama_build.py caches its build (this file runs as a script: it cannot import it).
    llama_server = os.environ.get("SERVESCOPE_LLAMA_SERVER") or str(
        Path.home() / ".cache" / "servescope" / "llama-server" / "11434.0.0" / "build" / "bin" / "llama-server")
    known["llama-server"] = Server(
        "llama-server", "llama.cpp llama-server (Q4_1, -t 2, -np 16)",
        [llama_server, "-m", str(GGUF), "--metrics", "-a", "smollm2-135m", "-t", "2", "-np", "16", "--host", "127.0.0.1",
         "--port", "{port}"],
        None, [llama_server, "--version"])
    for name, flags in ours_variants.items():
        ours = known["ours"]
        known[name] = Server(name, f"servescope serve {flags}", [*ours.argv, *shlex.split(flags)], None,
                             ours.version_argv)
    return known


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str, timeout: float = 5.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> float:
    """Seconds until ``/v1/models`` answers 200; raises if the server exits or never answers."""
    start = time.monotonic()
    while time.monotonic() - start < START_TIMEOUT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode} before answering; see {log}")
        if http_status(url + "/v1/models", timeout=2) == 200:
            return time.monotonic() - start
        time.sleep(1.0)
    raise RuntimeError(f"server did not answer {url}/v1/models in {START_TIMEOUT_S} s; see {log}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)


def load_argv(url: str, server: Server, args: argparse.Namespace, out: Path) -> list[str]:
    argv = [str(SERVESCOPE), "load", "--target", url, "--sweep", f"users={args.users}",
            "--duration", str(args.duration), "--warmup", str(args.warmup), "--max-tokens", str(args.max_tokens),
            "--no-ignore-eos", "--out", str(out)]
    if server.served_model is not None:
        argv += ["--served-model", server.served_model]
    return argv


def add_load_arguments(parser: argparse.ArgumentParser, users: str) -> None:
    """The load every server gets: the users of the sweep, each point's window and the tokens each request asks for."""
    parser.add_argument("--users", default=users)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=int, default=48)


def run_load(argv: list[str], args: argparse.Namespace, env: dict[str, str], log: Path) -> int:
    """Run one ``servescope load`` (``argv``) to its end, its output into ``log``; its exit status."""
    with log.open("w") as load_log:
        # NOTE: load exits 1 when its diagnosis has no verdict; the figures it measured still count.
        return subprocess.run(argv, env=env, stdout=load_log, stderr=subprocess.STDOUT,
                              timeout=len(args.users.split(",")) * (args.duration + args.warmup + 180) + 120
                              ).returncode


def cpu_and_flags(wanted: tuple[str, ...]) -> tuple[str, list[str]]:
    """This machine's CPU model (``lscpu``) and which of the ``wanted`` CPU flags it has."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    return model, [f for f in wanted if f in lscpu.split()]


def read_run(out: Path) -> dict[str, Any]:
    """Each point's output tok/s and TPOT p50 (summary.json), the dropped fields (load.json) and the verdict."""
    summary = json.loads((out / SUMMARY_NAME).read_text())
    points = []
    for point in summary["points"]:
        client = point["client"] or {}
        tpot = client.get("tpot_s") or {}
        points.append({"users": point["concurrency"], "output_tok_s": client.get("output_throughput"),
                       "tpot_p50_ms": 1000 * tpot["p50"] if "p50" in tpot else None,
                       "num_ok": client.get("num_ok"), "num_failed": client.get("num_failed"),
                       "warnings": [w["kind"] for w in point.get("warnings", [])]})
    dropped: set[str] = set()
    for load_json in out.rglob("load.json"):
        dropped.update(json.loads(load_json.read_text()).get("dropped_fields") or [])
    diagnosis = json.loads((out / DIAGNOSIS_NAME).read_text()) if (out / DIAGNOSIS_NAME).exists() else {}
    return {"points": points, "dropped_fields": sorted(dropped),
            "diagnosis": {k: diagnosis.get(k) for k in ("bottleneck", "confidence_label", "source", "summary",
                                                         "lever")}}


def run_server(server: Server, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / f"{server.name}.server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **server.env}
    asked = subprocess.run(server.version_argv, capture_output=True, text=True, env=env, timeout=120)
    version = asked.stdout.strip() or next(iter(asked.stderr.strip().splitlines()), "")  # llama-server: stderr
    command = server.command(port)
    print(f"== {server.name}: {shlex.join(command)}", flush=True)
    proc = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        ready_s = wait_ready(proc, url, log)
        metrics = http_status(url + "/metrics")
        target = discover_target(url, server.served_model)
        # What the server refuses of what the default load sends (ignore_eos on): the probe servescope's
        # load runs before every load; this comparison's own load asks for no ignore_eos.
        refused = list(probe_request(target, "completions", ignore_eos=True).dropped_fields)
        out = work / server.name
        argv = load_argv(url, server, args, out)
        print(f"   ready in {ready_s:.0f} s; {shlex.join(argv)}", flush=True)
        returncode = run_load(argv, args, env, work / f"{server.name}.load.log")
        result = {"load_returncode": returncode, **read_run(out)}
    finally:
        stop(proc)
    return {"name": server.name, "label": server.label, "version": version, "command": shlex.join(command),
            "metrics_status": metrics, "metrics_served": target.has_metrics, "refused_fields": refused, **result}


def table(results: list[dict[str, Any]]) -> str:
    users = [p["users"] for p in results[0]["points"]]
    lines = ["| server | " + " | ".join(f"{u:g} users" for u in users) + " |",
             "|---|" + "---|" * len(users)]
    for r in results:
        cells = [f"{p['output_tok_s']:.1f} ({p['tpot_p50_ms']:.0f} ms)" if p["output_tok_s"] and p["tpot_p50_ms"]
                 else "not measured" for p in r["points"]]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    ours = next((r for r in results if r["name"].startswith("ours")), None)
    if ours is not None:
        lines += ["", f"ratios of {ours['name']} (output tok/s over theirs; TPOT p50 theirs over ours, >1 is ours faster):"]
        for r in results:
            if r is ours:
                continue
            cells = []
            for a, b in zip(ours["points"], r["points"], strict=True):
                tput = a["output_tok_s"] / b["output_tok_s"] if a["output_tok_s"] and b["output_tok_s"] else None
                tpot = b["tpot_p50_ms"] / a["tpot_p50_ms"] if a["tpot_p50_ms"] and b["tpot_p50_ms"] else None
                cells.append(f"{tput:.2f}x / {tpot:.2f}x" if tput and tpot else "-")
            lines.append(f"| over {r['name']} | " + " | ".join(cells) + " |")
    lines += [""]
    for r in results:
        d = r["diagnosis"]
        lines.append(f"- {r['name']} ({r['version']}): refuses {r['refused_fields'] or 'nothing we send'}, "
                     f"/metrics {'served' if r['metrics_served'] else 'not served'} (HTTP {r['metrics_status']}); "
                     f"diagnosis: {d.get('bottleneck')} ({d.get('confidence_label')}, "
                     f"{d.get('source')}): {d.get('summary')}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--servers", default="ours,tf,tf-cb,llama")
    add_load_arguments(parser, users="1,4,8,16")
    parser.add_argument("--ours", action="append", default=[], metavar="NAME=FLAGS",
                        help="another servescope serve configuration, e.g. ours-bf16='--dtype bfloat16'")
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in args.ours)
    known = servers(variants)
    names = args.servers.split(",")
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown servers {unknown}; known: {', '.join(known)}")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    model, flags = cpu_and_flags(("avx512f", "avx512_bf16", "amx_bf16", "amx_tile"))
    results: list[dict[str, Any]] = []
    report = {"started": started, "cpu": model, "cpu_flags": flags, "nproc": os.cpu_count(),
              "argv": sys.argv, "servers": results}
    for name in names:
        results.append(run_server(known[name], args, args.out))
        print(json.dumps(results[-1]["points"]), flush=True)
        (args.out / "servers.json").write_text(json.dumps(report, indent=2))  # after each, in case one fails
    print(f"\n{started}; CPU {model} ({', '.join(flags) or 'no AVX-512'}), {os.cpu_count()} cores\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
