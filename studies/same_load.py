"""llama.cpp's ``llama-server`` and ``servescope serve`` configurations under the same load, one after the other.

Every server gets the same client and load (issue 35's table)::

    servescope load --target URL --sweep users=1,8 --duration 30 --warmup 5 --max-tokens 48 \\
        --tokenizer smollm2-135m

Run under the exclusive lock, e.g.::

    flock /tmp/ss-cpu.lock python -m studies.same_load OUT \\
        --llama /work/peers/llama/build/bin/llama-server --llama /work/peers/llama/build-vnni/bin/llama-server \\
        --ours "--dtype bfloat16 --weights int4" --ours "--dtype bfloat16"

Each llama-server binary runs as ``llama-server -m GGUF --metrics -a smollm2-135m -t 2 -np N`` (``--np``,
default 8); each ``--ours`` as ``servescope serve FLAGS``. Per server and point this prints output tok/s,
TPOT p50 and how many requests succeeded and failed (the figures count successful requests only), writes
``OUT/same_load.json`` and a markdown table, with the best llama-server row per point marked.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studies.servers import (
    GGUF,
    SERVESCOPE,
    add_load_arguments,
    cpu_and_flags,
    read_run,
    run_load,
    stop,
    wait_ready,
)
from studies.servers import free_port as _free_port

SERVED_NAME = "smollm2-135m"


@dataclass(slots=True)
class Target:
    """One server to start: ``argv`` with ``{port}`` to fill in, and the label the table shows."""

    name: str
    label: str
    argv: list[str]
    version_argv: list[str]

    def command(self, port: int) -> list[str]:
        return [a.replace("{port}", str(port)) for a in self.argv]


def llama_target(binary: Path, num_slots: int, threads: int) -> Target:
    build = binary.parent.parent.name  # e.g. build, build-vnni
    argv = [str(binary), "-m", str(GGUF), "--metrics", "-a", SERVED_NAME, "-t", str(threads), "-np", str(num_slots),
            "--host", "127.0.0.1", "--port", "{port}"]
    return Target(f"llama-{build}-np{num_slots}", f"llama-server ({build}) -t {threads} -np {num_slots}", argv,
                  [str(binary), "--version"])


def ours_target(flags: str) -> Target:
    argv = [str(SERVESCOPE), "serve", "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning",
            *shlex.split(flags)]
    name = "ours " + (flags or "(defaults)")
    return Target(name, f"servescope serve {flags}".strip(), argv,
                  [sys.executable, "-c", "import importlib.metadata as m; print(m.version('servescope'))"])


def load_argv(url: str, args: argparse.Namespace, out: Path) -> list[str]:
    return [str(SERVESCOPE), "load", "--target", url, "--sweep", f"users={args.users}", "--duration",
            str(args.duration), "--warmup", str(args.warmup), "--max-tokens", str(args.max_tokens), "--tokenizer",
            SERVED_NAME, "--out", str(out)]


def run_target(target: Target, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / f"{target.name.replace(' ', '_')}.server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    version = subprocess.run(target.version_argv, capture_output=True, text=True, env=env, timeout=120)
    command = target.command(port)
    print(f"== {target.label}: {shlex.join(command)}", flush=True)
    proc = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        ready_s = wait_ready(proc, url, log)
        out = work / target.name.replace(" ", "_")
        argv = load_argv(url, args, out)
        print(f"   ready in {ready_s:.0f} s; {shlex.join(argv)}", flush=True)
        returncode = run_load(argv, args, env, work / f"{target.name.replace(' ', '_')}.load.log")
        result = {"load_returncode": returncode, **read_run(out)}
    finally:
        stop(proc)
    text = (version.stdout + version.stderr).strip().splitlines()
    return {"name": target.name, "label": target.label, "command": shlex.join(command),
            "load_command": shlex.join(argv), "version": " ".join(text[-2:]) if text else "?", **result}


def table(results: list[dict[str, Any]]) -> str:
    users = [p["users"] for p in results[0]["points"]]
    lines = ["| server | " + " | ".join(f"{u:g} user{'s' if u != 1 else ''}: tok/s, TPOT p50 (ok/failed)"
                                        for u in users) + " |", "|---|" + "---|" * len(users)]
    for r in results:
        cells = []
        for p in r["points"]:
            if p["output_tok_s"] and p["tpot_p50_ms"]:
                cells.append(f"{p['output_tok_s']:.1f}, {p['tpot_p50_ms']:.1f} ms ({p['num_ok']}/{p['num_failed']})")
            else:
                cells.append("not measured")
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    llama = [r for r in results if r["name"].startswith("llama")]
    ours = [r for r in results if r["name"].startswith("ours")]
    if llama and ours:
        lines.append("")
        for i, u in enumerate(users):
            best_llama_tok = max(llama, key=lambda r: r["points"][i]["output_tok_s"] or 0)
            best_llama_tpot = min(llama, key=lambda r: r["points"][i]["tpot_p50_ms"] or float("inf"))
            best_ours_tok = max(ours, key=lambda r: r["points"][i]["output_tok_s"] or 0)
            best_ours_tpot = min(ours, key=lambda r: r["points"][i]["tpot_p50_ms"] or float("inf"))
            lt, ot = best_llama_tok["points"][i]["output_tok_s"], best_ours_tok["points"][i]["output_tok_s"]
            lp, op = best_llama_tpot["points"][i]["tpot_p50_ms"], best_ours_tpot["points"][i]["tpot_p50_ms"]
            if lt and ot and lp and op:
                lines.append(f"- {u:g} user(s): best tok/s ours {ot:.1f} ({best_ours_tok['label']}) vs llama-server "
                             f"{lt:.1f} ({best_llama_tok['label']}): {ot / lt:.2f}x; best TPOT p50 ours {op:.1f} ms "
                             f"({best_ours_tpot['label']}) vs {lp:.1f} ms ({best_llama_tpot['label']}): "
                             f"{lp / op:.2f}x")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--llama", action="append", default=[], type=Path, help="a llama-server binary (repeatable)")
    parser.add_argument("--np", default="8", help="llama-server slots, comma-separated: one run per value")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ours", action="append", default=[], help="servescope serve flags (repeatable)")
    add_load_arguments(parser, users="1,8")
    args = parser.parse_args()
    targets = [llama_target(b, int(n), args.threads) for b in args.llama for n in args.np.split(",")]
    targets += [ours_target(flags) for flags in args.ours]
    if not targets:
        parser.error("nothing to run: give --llama and/or --ours")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    model, flags = cpu_and_flags(("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile"))
    results: list[dict[str, Any]] = []
    report = {"started": started, "cpu": model, "cpu_flags": flags, "nproc": os.cpu_count(), "argv": sys.argv,
              "servers": results}
    for target in targets:
        results.append(run_target(target, args, args.out))
        print(json.dumps(results[-1]["points"]), flush=True)
        (args.out / "same_load.json").write_text(json.dumps(report, indent=2))
    text = f"{started}; CPU {model} ({', '.join(flags) or 'no AVX-512'}), {os.cpu_count()} cores\n\n{table(results)}"
    (args.out / "same_load.md").write_text(text + "\n")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
