"""An independent cross-check: servescope's load and GuideLLM 0.8.1, one after the other, against the
same ``servescope serve --model smollm2-135m``, the same lengths and concurrency: the two clients'
TTFT and ITL medians and output tokens/s agree within ``TOLERANCE``.

NOTE: GuideLLM's ``inter_token_latency_ms`` is a per-request mean, (last token - first token) /
(output tokens - 1) (guidellm/schemas/base/request_stats.py), which is what servescope calls TPOT; so
its median is compared with servescope's TPOT median. servescope's ITL (every gap between chunks) is
printed beside it: with streams' prefills landing between decode steps its median is shorter.
With 4 streams in near lockstep the per-request ITL is bimodal (a request whose prefill waited decodes
faster after it), so its median moves by several ms between two runs of one client; its mean, the
end-to-end median and TTFT median are what are held to ``TOLERANCE``; both ITL medians are printed.

Run with ``tox -e peers`` (about 3 minutes on 2 cores). Each side's figures come from its own output
(servescope's ``summary.json``, GuideLLM's JSON); both are printed, for docs/results.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.weights import load_model
from probes.run_dir import SUMMARY_NAME, RunDirectory
from reports.summary import RunSummary
from tests.server.serve_process import ServeProcess

pytestmark = pytest.mark.peers

MODEL = "smollm2-135m"
CONCURRENCY = 4
PROMPT_TOKENS = 128  # the fixed workload's prompt length
OUTPUT_TOKENS = 32
DURATION_S = 60
WARMUP_S = 5
TOLERANCE = 0.10
RUN_TIMEOUT_S = 600


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run these tests with `tox -e peers`")
    return path


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    # NOTE: no prefix caching: servescope's plan wraps around and resends its prompts, GuideLLM's never repeat.
    process = ServeProcess("--model", MODEL, "--execution", "optimized", "--no-prefix-caching")
    yield process
    process.stop()


def _run(argv: list[str], cwd: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{argv[0]} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def _servescope(url: str, tmp_path: Path) -> dict[str, float]:
    out = tmp_path / "servescope"
    _run([_tool("servescope"), "load", "--target", url, "--users", str(CONCURRENCY), "--duration", str(DURATION_S),
          "--warmup", str(WARMUP_S), "--workload", "fixed", "--max-tokens", str(OUTPUT_TOKENS), "--out", str(out)],
         tmp_path)
    summary = RunDirectory(out).load(SUMMARY_NAME, RunSummary)
    assert summary is not None
    (point,) = summary.points
    c = point.client
    assert c is not None and c.num_failed == 0 and c.num_ok > 0
    return {"ttft_p50_ms": 1000 * c.ttft_s["p50"], "itl_p50_ms": 1000 * c.tpot_s["p50"],
            "itl_mean_ms": 1000 * c.tpot_s["mean"], "e2e_p50_ms": 1000 * c.e2e_s["p50"],
            "chunk_gap_p50_ms": 1000 * c.itl_s["p50"],
            "output_tok_s": c.output_throughput, "requests": c.num_ok,
            "prompt_tokens": float(PROMPT_TOKENS)}


def _guidellm(url: str, tmp_path: Path) -> dict[str, float]:
    work = tmp_path / "guidellm"
    work.mkdir()
    tokenizer = load_model(MODEL).tokenizer.save_pretrained(work / "tokenizer")
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": MODEL, "request_format": "/v1/completions"},
        "profile": {"kind": "concurrent", "streams": [CONCURRENCY]},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "constraints": [{"kind": "max_duration", "seconds": DURATION_S}],
        "outputs": [{"kind": "json", "path": str(work / "out.json")}],
    }}
    (work / "scenario.json").write_text(json.dumps(scenario))
    _run([_tool("guidellm"), "run", "--scenario", str(work / "scenario.json"), "--disable-console-interactive"], work)
    (benchmark,) = json.loads((work / "out.json").read_text())["benchmarks"]
    m = benchmark["metrics"]
    assert m["request_totals"]["errored"] == 0 and m["request_totals"]["successful"] > 0
    return {"ttft_p50_ms": m["time_to_first_token_ms"]["successful"]["median"],
            "itl_p50_ms": m["inter_token_latency_ms"]["successful"]["median"],
            "itl_mean_ms": m["inter_token_latency_ms"]["successful"]["mean"],
            "e2e_p50_ms": 1000 * m["request_latency"]["successful"]["median"],
            "output_tok_s": m["output_tokens_per_second"]["successful"]["mean"],
            "requests": m["request_totals"]["successful"],
            "prompt_tokens": m["prompt_token_count"]["successful"]["mean"]}


def test_servescope_and_guidellm_agree_on_the_same_server(server: ServeProcess, tmp_path: Path) -> None:
    ours = _servescope(server.url, tmp_path)  # first: its warm-up also warms the server for GuideLLM
    theirs = _guidellm(server.url, tmp_path)
    print("\n| client | requests | TTFT p50 ms | E2E p50 ms | per-request ITL p50 / mean ms | output tok/s |")
    for name, r in (("servescope load", ours), ("GuideLLM 0.8.1", theirs)):
        print(f"| {name} | {r['requests']} | {r['ttft_p50_ms']:.1f} | {r['e2e_p50_ms']:.1f} | {r['itl_p50_ms']:.1f} / "
              f"{r['itl_mean_ms']:.1f} | {r['output_tok_s']:.1f} |")
    print(f"servescope's chunk-gap ITL p50: {ours['chunk_gap_p50_ms']:.1f} ms")
    for name in ("ttft_p50_ms", "e2e_p50_ms", "itl_mean_ms", "output_tok_s"):
        assert ours[name] == pytest.approx(theirs[name], rel=TOLERANCE), (name, ours, theirs)
