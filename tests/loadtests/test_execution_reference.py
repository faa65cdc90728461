"""Timing a server's decode step from outside: streams delivered in bursts time nothing.

A small stdlib HTTP server on loopback streams SSE completions either a token per write with a pause
between (a server stepping), or every token in one write (a stream held back and flushed at once, as a
fresh server's first stream was seen to be: it read as a 5 us step and won "best of 5").
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadtests.run.execution_reference import _time_in_turns, http_target_step

NUM_TOKENS = 12
STEP_S = 0.004


def _events() -> list[bytes]:
    events = [b'data: ' + json.dumps({"choices": [{"text": "x", "finish_reason": None}]}).encode() + b"\n\n"
              for _ in range(NUM_TOKENS - 1)]
    events.append(b'data: ' + json.dumps({"choices": [{"text": "x", "finish_reason": "length"}]}).encode() + b"\n\n")
    events.append(b'data: ' + json.dumps({"choices": [], "usage": {"completion_tokens": NUM_TOKENS}}).encode()
                  + b"\n\ndata: [DONE]\n\n")
    return events


@contextmanager
def sse_server(bursty: bool) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            events = _events()
            if bursty:
                time.sleep(STEP_S * NUM_TOKENS)  # the steps happened; the client sees none of them apart
                self.wfile.write(b"".join(events))
            else:
                for event in events:
                    time.sleep(STEP_S)
                    self.wfile.write(event)
                    self.wfile.flush()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_stepping_stream_times_its_steps() -> None:
    with sse_server(bursty=False) as url:
        step = http_target_step(url, "m", num_tokens=NUM_TOKENS)(1, 8)()
    assert STEP_S * 0.8 < step < STEP_S * 5  # the sleeps, plus a loaded machine's delays


def test_a_stream_delivered_in_one_burst_is_not_timed() -> None:
    with sse_server(bursty=True) as url, pytest.raises(ValueError, match="separate deliveries"):
        http_target_step(url, "m", num_tokens=NUM_TOKENS)(1, 8)()


def test_rounds_that_could_not_be_timed_are_skipped_and_all_of_them_is_an_error() -> None:
    outcomes = iter([ValueError("burst"), 0.002, 0.003, ValueError("burst")])

    def flaky() -> float:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    timing = _time_in_turns("m", 1, 8, target=lambda: 0.005, reference=flaky, num_rounds=4, label="ref")
    assert timing.step_s == {"optimized": 0.002, "target": 0.005}

    def never() -> float:
        raise ValueError("burst")

    with pytest.raises(ValueError, match="no round of 3 could time the optimized side: burst"):
        _time_in_turns("m", 1, 8, target=lambda: 0.005, reference=never, num_rounds=3, label="ref")
