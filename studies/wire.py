"""What crossed the wire: a loopback packet capture of one client's run, read as per-request timings.

A client's TTFT and ITL are its own clock's readings; the capture is an independent one, taken by the
kernel when each packet passed the loopback interface. Reading both for one run tells how much of a
latency tail the server and the OS made (it is on the wire) and how much the client added (it is not).

Per TCP connection, a request starts at the last client-to-server payload packet before the server
answers; each server-to-client packet carries zero or more SSE token events (counted by the
``"finish_reason": null`` that every token event of an OpenAI stream carries, chat or completions).
A packet carrying several tokens gives one gap and then zero gaps, as a client reading it sees.

Needs ``dumpcap`` and ``tshark`` (Debian's ``tshark``) and the right to capture on ``lo`` (root).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

TOKEN_MARK = b'"finish_reason": null'
TOKEN_MARK_COMPACT = b'"finish_reason":null'


@dataclass(slots=True)
class WireTimings:
    """Per-request figures as the capture saw them, in seconds."""

    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)  # every gap between token events
    tpot_s: list[float] = field(default_factory=list)  # per request: (last - first token) / (tokens - 1)
    num_requests: int = 0
    num_packets: int = 0
    num_multi_token_packets: int = 0


class Capture:
    """``dumpcap`` on ``lo`` for one TCP port, as a context manager; the file is read afterwards."""

    def __init__(self, path: Path, port: int) -> None:
        self.path = path
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("dumpcap") is not None and shutil.which("tshark") is not None

    def __enter__(self) -> Capture:
        self._process = subprocess.Popen(
            ["dumpcap", "-q", "-i", "lo", "-f", f"tcp port {self.port}", "-w", str(self.path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not self.path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # NOTE: dumpcap creates the file before its filter is live
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.terminate()
        self._process.wait(timeout=30)


def read_capture(path: Path, server_port: int, window: tuple[float, float] | None = None) -> WireTimings:
    """Per-request timings of every stream in the capture (requests starting inside ``window``, epoch s)."""
    out = subprocess.run(
        ["tshark", "-r", str(path), "-Y", "tcp.len > 0", "-T", "fields", "-e", "frame.time_epoch",
         "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.payload"],
        check=True, capture_output=True, text=True).stdout
    # per connection: (request start, token times of the current response)
    open_requests: dict[str, tuple[float, list[float]]] = {}
    pending_send: dict[str, float] = {}
    timings = WireTimings()

    def close(stream: str) -> None:
        start, tokens = open_requests.pop(stream)
        if not tokens or (window is not None and not window[0] <= start < window[1]):
            return
        timings.num_requests += 1
        timings.ttft_s.append(tokens[0] - start)
        timings.itl_s.extend(b - a for a, b in zip(tokens, tokens[1:], strict=False))
        if len(tokens) > 1:
            timings.tpot_s.append((tokens[-1] - tokens[0]) / (len(tokens) - 1))

    for line in out.splitlines():
        stamp, stream, src_port, payload_hex = line.split("\t")
        now = float(stamp)
        if int(src_port) != server_port:
            if stream in open_requests:
                close(stream)
            pending_send[stream] = now  # the last request packet so far
            continue
        timings.num_packets += 1
        if stream in pending_send:
            open_requests[stream] = (pending_send.pop(stream), [])
        if stream not in open_requests:
            continue
        payload = bytes.fromhex(payload_hex)
        count = payload.count(TOKEN_MARK) + payload.count(TOKEN_MARK_COMPACT)
        if count > 1:
            timings.num_multi_token_packets += 1
        open_requests[stream][1].extend([now] * count)
    for stream in list(open_requests):
        close(stream)
    return timings
