"""GuideLLM 0.8.1 and AIPerf 0.13.0 themselves, each a short bounded run against ``servescope serve``.

Run with ``tox -e peers`` (which installs both); success and error counts come from each client's
own JSON output. Both clients count tokens with a tokenizer of their own, so the dummy model's
tokenizer is written out as an HF tokenizer directory for them.
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
from tests.server.conftest import MODEL
from tests.server.serve_process import ServeProcess

pytestmark = pytest.mark.peers

NUM_REQUESTS = 24
CONCURRENCY = 4
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 16
RUN_TIMEOUT_S = 600


def _client(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run these tests with `tox -e peers`")
    return path


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    process = ServeProcess()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return load_model(MODEL).tokenizer.save_pretrained(tmp_path_factory.mktemp("tokenizer"))


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{argv[0]} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("request_format", ["/v1/chat/completions", "/v1/completions"])
def test_guidellm_run_has_no_errors(server: ServeProcess, tokenizer_dir: Path, tmp_path: Path,
                                    request_format: str) -> None:
    out = tmp_path / "guidellm.json"
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": server.url, "model": MODEL, "request_format": request_format},
        "profile": {"kind": "concurrent", "streams": [CONCURRENCY]},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer_dir)},
        "constraints": [{"kind": "max_requests", "count": NUM_REQUESTS}, {"kind": "max_duration", "seconds": 120}],
        "outputs": [{"kind": "json", "path": str(out)}],
    }}
    (tmp_path / "scenario.json").write_text(json.dumps(scenario))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    _run([_client("guidellm"), "run", "--scenario", str(tmp_path / "scenario.json"), "--disable-console-interactive"],
         env, tmp_path)
    (benchmark,) = json.loads(out.read_text())["benchmarks"]
    metrics = benchmark["metrics"]
    assert metrics["request_totals"] == {"successful": NUM_REQUESTS, "errored": 0, "incomplete": 0,
                                         "total": NUM_REQUESTS}
    assert metrics["output_token_count"]["successful"]["mean"] == OUTPUT_TOKENS
    assert metrics["time_to_first_token_ms"]["successful"]["mean"] > 0


@pytest.mark.parametrize("endpoint_type", ["chat", "completions"])
def test_aiperf_profile_has_no_errors(server: ServeProcess, tokenizer_dir: Path, tmp_path: Path,
                                      endpoint_type: str) -> None:
    artifacts = tmp_path / "aiperf"
    # NOTE: AIPerf's offline mode looks a local tokenizer up in the hub cache; a path loads without it.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    # NOTE: the dummy model's random byte-level output does not re-tokenize to the same count, so
    # AIPerf is told to use the server's counts (per-chunk usage); skip_special_tokens:false keeps every
    # chunk's text non-empty, since AIPerf counts a response without any text as an error.
    _run([_client("aiperf"), "profile", "--model", MODEL, "--url", server.url, "--endpoint-type", endpoint_type,
          "--streaming", "--tokenizer", str(tokenizer_dir),
          "--synthetic-input-tokens-mean", str(PROMPT_TOKENS), "--synthetic-input-tokens-stddev", "0",
          "--output-tokens-mean", str(OUTPUT_TOKENS), "--output-tokens-stddev", "0",
          "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{OUTPUT_TOKENS}",
          "--extra-inputs", "skip_special_tokens:false", "--use-server-token-count",
          *(["--per-chunk-usage"] if endpoint_type == "chat" else []),
          "--concurrency", str(CONCURRENCY), "--request-count", str(NUM_REQUESTS), "--ui-type", "none",
          "--artifact-dir", str(artifacts), "--no-gpu-telemetry", "--no-server-metrics"], env, tmp_path)
    result = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    assert result["error_summary"] == [] and not result["was_cancelled"]
    assert result["completed_request_count"]["avg"] == NUM_REQUESTS
    assert result["request_error_rate"]["avg"] == 0
    assert result["usage_completion_tokens"]["min"] == result["usage_completion_tokens"]["max"] == OUTPUT_TOKENS
    assert result["time_to_first_token"]["avg"] > 0
