"""Client fidelity: servescope load and GuideLLM, one after the other, against ``guidellm mock-server``
(truth: TTFT 100 ms, ITL 10 ms, 32 tokens). Run in an environment with both installed (``tox -e peers``):
``python tests/peers/fidelity.py DIR 16,64 1,2 20`` (concurrencies, servescope worker processes, seconds).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from engine.weights import load_model
from probes.run_dir import SUMMARY_NAME, RunDirectory
from reports.summary import RunSummary

PEERS = Path(shutil.which("guidellm") or "guidellm").parent
SS = Path(shutil.which("servescope") or "servescope").parent
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
            subprocess.run([SS / "servescope", "load", "--target", url, "--served-model", "dummy:tiny", "--tokenizer", "dummy:tiny",
                            "--users", str(c), "--duration", str(dur), "--warmup", "3", "--workload", "fixed",
                            "--max-tokens", "32", "--no-ignore-eos", "--processes", str(p), "--out", str(out)],
                           check=True, env=env, stdout=(work / f"ss-c{c}-p{p}.log").open("w"), stderr=subprocess.STDOUT, timeout=600)  # noqa: SIM115
            # The measures servescope itself reports for the point (reports.measures.client_measures).
            (point,) = RunDirectory(out).load(SUMMARY_NAME, RunSummary).points
            cm = point.client
            rows.append((f"servescope load --processes {p}", c, cm.request_throughput,
                         1000 * cm.ttft_s["p50"], 1000 * cm.ttft_s["p99"], 1000 * cm.itl_s["p50"],
                         1000 * cm.itl_s["p99"], cm.num_ok))
            print(rows[-1], flush=True)
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
        subprocess.run([PEERS / "guidellm", "run", "--scenario", str(g / "scenario.json"), "--disable-console-interactive"],
                       check=True, env=env, cwd=g, stdout=(g / "log").open("w"), stderr=subprocess.STDOUT, timeout=600)  # noqa: SIM115
        (b,) = json.loads((g / "out.json").read_text())["benchmarks"]
        mt = b["metrics"]
        def pct(name, q, mt=mt):
            d = mt[name]["successful"]
            return d.get("percentiles", {}).get(q) if q != "median" else d.get("median")
        rows.append(("GuideLLM 0.8.1", c, mt["requests_per_second"]["successful"]["mean"],
                     pct("time_to_first_token_ms", "median"), pct("time_to_first_token_ms", "p99"),
                     pct("inter_token_latency_ms", "median"), pct("inter_token_latency_ms", "p99"),
                     mt["request_totals"]["successful"]))
        print(rows[-1], flush=True)
    print("| client | concurrency | req/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | requests |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.0f} / {r[4]:.0f} | {r[5]:.1f} / {r[6]:.1f} | {r[7]} |")
finally:
    mock.kill()
