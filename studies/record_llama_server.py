"""Record what llama.cpp's ``llama-server`` answers, for the replay tests of the default run.

    python -m studies.record_llama_server LLAMA_SERVER_BINARY [OUT_DIR]

Starts the server on the bundled GGUF with four slots over a small unified KV pool (``-np 4 -kvu -c 512``),
then writes into ``OUT_DIR`` (default ``tests/loadtests/fixtures/llama_server``) the exact bytes of:
``models.json``, ``props.json``, ``slots-idle.json``, ``metrics-idle.txt`` and ``metrics-busy.txt`` (scraped
while four long requests share the pool), ``slots-busy.json``, ``metrics-after.txt``,
``metrics-deferred.txt`` (six requests on the four slots: two deferred); ``stream-completions.http`` and
``stream-chat.http`` (a whole streamed response, status line and headers included, and whether the
server closed the connection after it: ``closed-after-stream.json``); ``error-too-long.http`` (a prompt
larger than a slot's context) and ``stream-kv-exhausted.http`` (a 200 stream that ends in "Context size
has been exceeded." when the concurrent requests outgrow the shared pool).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from studies.servers import GGUF, free_port

OUT = Path(__file__).resolve().parents[1] / "tests" / "loadtests" / "fixtures" / "llama_server"
MODEL = "smollm2-135m"


def raw_exchange(port: int, method: str, path: str, body: dict | None = None) -> tuple[bytes, bool]:
    """One request on a fresh keep-alive connection: the whole response as bytes, and whether the
    server then closed the connection (read EOF within a second of the response's end)."""
    payload = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: keep-alive\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(head + payload)
        data = b""
        while not _complete(data):
            chunk = sock.recv(65536)
            if not chunk:
                return data, True
            data += chunk
        sock.settimeout(1.0)
        try:
            return data, sock.recv(1) == b""
        except TimeoutError:
            return data, False


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    headers = head.decode("latin-1").lower()
    if "transfer-encoding: chunked" in headers:
        return body.endswith(b"0\r\n\r\n")
    for line in headers.split("\r\n"):
        if line.startswith("content-length:"):
            return len(body) >= int(line.split(":", 1)[1])
    return False


def _num_processing(text: bytes) -> float:
    return _gauge(text, "requests_processing")


def _gauge(text: bytes, name: str) -> float:
    for line in text.decode().splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    return 0.0


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return response.read()


def main(binary: str, out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [binary, "-m", str(GGUF), "--metrics", "-a", MODEL, "-t", "2", "-np", "4", "-kvu", "-c", "512",
            "--host", "127.0.0.1", "--port", str(port)]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            _record(port, out, binary, argv)
        finally:
            proc.terminate()
            proc.wait(30)


def _record(port: int, out: Path, binary: str, argv: list[str]) -> None:
    """Every recording of the module docstring, from the server listening on ``port``."""
    for _ in range(120):
        try:
            get(port, "/health")
            break
        except OSError:
            time.sleep(0.5)
    (out / "command.json").write_text(json.dumps({"argv": [Path(binary).name, *argv[1:]]}, indent=1) + "\n")
    for name, path in (("models.json", "/v1/models"), ("props.json", "/props"), ("slots-idle.json", "/slots"),
                       ("metrics-idle.txt", "/metrics")):
        (out / name).write_bytes(get(port, path))
    closed = {}
    completion = {"model": MODEL, "prompt": "Tell me a story about a cat.", "max_tokens": 8, "stream": True,
                  "stream_options": {"include_usage": True}, "ignore_eos": True}
    data, closed["completions"] = raw_exchange(port, "POST", "/v1/completions", completion)
    (out / "stream-completions.http").write_bytes(data)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    data, closed["chat"] = raw_exchange(port, "POST", "/v1/chat/completions", chat)
    (out / "stream-chat.http").write_bytes(data)
    data, closed["models"] = raw_exchange(port, "GET", "/v1/models")
    too_long = {**completion, "prompt": " ".join(["hello"] * 600)}
    data, closed["error"] = raw_exchange(port, "POST", "/v1/completions", too_long)
    (out / "error-too-long.http").write_bytes(data)
    (out / "closed-after-stream.json").write_text(json.dumps(closed, indent=1) + "\n")
    # Four requests of 100 prompt + 200 output tokens outgrow the 512-token pool they share.
    long = {**completion, "prompt": " ".join(["hello"] * 100), "max_tokens": 200}
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(raw_exchange(port, "POST", "/v1/completions",
                                                                           long)[0])) for _ in range(4)]
    for thread in threads:
        thread.start()
    # NOTE: the scrape with the most requests in slots, while they run (the gauges are instantaneous).
    scrapes = []
    for _ in range(12):
        time.sleep(0.5)
        scrapes.append(get(port, "/metrics"))
    busiest = max(scrapes, key=_num_processing)
    (out / "metrics-busy.txt").write_bytes(busiest)
    (out / "slots-busy.json").write_bytes(get(port, "/slots"))
    for thread in threads:
        thread.join()
    exhausted = [r for r in results if b"Context size has been exceeded" in r]
    if not exhausted:
        raise RuntimeError("no request ran out of the shared KV pool; the fixture was not recorded")
    (out / "stream-kv-exhausted.http").write_bytes(exhausted[0])
    (out / "metrics-after.txt").write_bytes(get(port, "/metrics"))
    # Six short requests on four slots: two wait for a slot (requests_deferred).
    short = {**completion, "max_tokens": 48}
    threads = [threading.Thread(target=raw_exchange, args=(port, "POST", "/v1/completions", short))
               for _ in range(6)]
    for thread in threads:
        thread.start()
    scrapes = []
    for _ in range(8):
        time.sleep(0.25)
        scrapes.append(get(port, "/metrics"))
    (out / "metrics-deferred.txt").write_bytes(max(scrapes, key=lambda t: _gauge(t, "requests_deferred")))
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else OUT)
