"""``servescope serve`` as users run it: flags, the baseline engines, and a graceful exit on SIGTERM/SIGINT."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from engine.flags import engine_config_from_args
from engine.server.app import ServerSettings
from engine.server.cli import build_engine, run_serve
from loadtests.cli import build_parser
from tests.server.conftest import MODEL, start_server, stop_server
from tests.server.serve_process import EXIT_TIMEOUT_S, STARTUP_TIMEOUT_S, ServeProcess


def test_serve_parses_every_documented_flag() -> None:
    args = build_parser().parse_args([
        "serve", "--model", MODEL, "--engine", "static", "--host", "127.0.0.1", "--port", "8123",
        "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--kv-cache-mb", "8", "--block-size", "8",
        "--kv-layout", "contiguous", "--execution", "eager", "--no-prefix-caching", "--max-waiting", "3",
        "--api-key", "k",
    ])
    assert (args.engine, args.host, args.port, args.max_waiting, args.api_key) == ("static", "127.0.0.1", 8123, 3, "k")
    config = engine_config_from_args(args)
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.kv_cache_mb, config.block_size) == (4, 64, 8, 8)
    assert (config.kv_layout, config.execution, config.enable_prefix_caching) == ("contiguous", "eager", False)
    assert build_parser().parse_args(["serve", "--num-kv-blocks", "64"]).num_kv_blocks == 64


def test_serve_binds_loopback_by_default() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.engine, args.api_key) == ("127.0.0.1", 8000, "continuous", None)


def test_kv_size_flags_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--kv-cache-mb", "8", "--num-kv-blocks", "64"])


@pytest.mark.parametrize("kind", ["naive", "static", "hf-cb"])
def test_baseline_engines_serve_the_same_api(kind: str) -> None:
    args = build_parser().parse_args(["serve", "--model", MODEL, "--engine", kind, "--max-num-seqs", "2"])
    live = start_server(build_engine(kind, engine_config_from_args(args)), ServerSettings())
    try:
        body = {"model": MODEL, "prompt": "baseline", "max_tokens": 5, "ignore_eos": True, "temperature": 0.0}
        response = httpx.post(f"{live.api_url}/completions", json=body, timeout=60)
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 5
        with httpx.stream("POST", f"{live.api_url}/completions", json={**body, "stream": True}, timeout=60) as stream:
            assert [line for line in stream.iter_lines() if line.startswith("data: ")][-1] == "data: [DONE]"
        live.wait_idle()
    finally:
        stop_server(live)


@pytest.fixture
def serve_process() -> Iterator[ServeProcess]:
    process = ServeProcess()
    yield process
    if process.proc.poll() is None:
        process.proc.kill()
        process.proc.wait(timeout=EXIT_TIMEOUT_S)


def test_sigterm_finishes_the_stream_in_flight_then_exits_cleanly(serve_process: ServeProcess) -> None:
    body = {"model": MODEL, "prompt": "last words", "max_tokens": 100, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{serve_process.url}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        serve_process.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    usage = json.loads(rest[-2].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == 100, "the request in flight ran to the end"
    assert serve_process.exit_code() == 0, "".join(serve_process.log)
    assert "Traceback" not in "".join(serve_process.log)


def test_sigint_stops_run_serve_which_returns_zero() -> None:
    """In this process, on the main thread (where signals land), so no second interpreter starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = build_parser().parse_args(["serve", "--model", MODEL, "--port", str(port), "--execution", "eager",
                                      "--num-kv-blocks", "64", "--log-level", "warning"])
    served: list[int] = []

    def client() -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
        served.append(httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30).status_code)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    assert run_serve(args) == 0
    thread.join(timeout=EXIT_TIMEOUT_S)
    assert served == [200]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the previous handler is back"
