"""A loopback HTTP/1.1 server that replays what llama.cpp's ``llama-server`` was recorded answering.

The recordings (``fixtures/llama_server``, written by ``tests/peers/record_llama_server.py``) hold its
``/v1/models``, ``/props``, ``/slots`` and ``/metrics`` bodies, whole streamed responses and error
responses. This server speaks raw HTTP/1.1 on asyncio so that it can do what llama-server does to a
connection and an ordinary framework would not: end a streamed response that advertised
``Keep-Alive`` and then close the connection (cpp-httplib does so after every stream). ``close``
says when:

- ``"keep"``: never (an ordinary keep-alive server);
- ``"at_once"``: right after the stream's last chunk, as llama-server does;
- ``"after_next_request"``: when the client's next request on that connection has arrived, unanswered:
  the worst case of llama-server's race, made certain (the client sent on a connection the server was
  closing).

Each POST is answered by ``answer(n, path, in_flight)`` (n counts the POSTs from 0; ``in_flight`` how many,
this one included, the server is answering at that moment): a recorded stream, a recorded error response, or
``DROP`` (close the connection without an answer, as a server shedding load). ``in_flight`` lets a test
fail requests only under load, as a server out of slots or KV cache does.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

FIXTURES = Path(__file__).parent / "fixtures" / "llama_server"
DROP = b""  # answer(n) -> DROP: the connection is closed without a response
Close = Literal["keep", "at_once", "after_next_request"]


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded HTTP response: status line and headers, and its body (de-chunked), split into SSE events."""

    head: bytes  # status line and headers, without the blank line and without Transfer-Encoding
    events: list[bytes]  # a streamed body's events ("data: ...\n\n"), or the whole body of a plain response
    is_stream: bool

    @classmethod
    def read(cls, path: Path) -> Recorded:
        raw = path.read_bytes()
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        is_chunked = any(line.lower() == b"transfer-encoding: chunked" for line in lines)
        kept = [line for line in lines if not line.lower().startswith((b"transfer-encoding", b"content-length"))]
        if not is_chunked:
            return cls(b"\r\n".join(kept), [body], is_stream=False)
        data = _dechunk(body)
        events = [event + b"\n\n" for event in data.split(b"\n\n") if event.strip()]
        return cls(b"\r\n".join(kept), events, is_stream=True)

    def body(self) -> bytes:
        return b"".join(self.events)


def _dechunk(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


def recorded(name: str) -> Recorded:
    return Recorded.read(FIXTURES / name)


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


@dataclass
class ReplayServer:
    """What the test reads back: the URL, how many POSTs came and how many connections were opened."""

    url: str = ""
    num_posts: int = 0
    num_connections: int = 0
    num_closed_unanswered: int = 0  # requests that arrived on a connection the server then closed
    metrics_texts: list[str] = field(default_factory=list)
    num_scrapes: int = 0
    num_in_flight: int = 0  # POSTs being answered now


# NOTE: the recording's model is smollm2-135m, which servescope can load; a load against the replay would then
# time servescope's own server on it after the load (the outside execution reference), minutes of work.
REPLAY_MODEL = "replayed-llama-server"


def _models_body() -> bytes:
    return (FIXTURES / "models.json").read_bytes().replace(b'"smollm2-135m"', f'"{REPLAY_MODEL}"'.encode())


def _stream_for(path: str) -> Recorded:
    return recorded("stream-chat.http" if path.endswith("/chat/completions") else "stream-completions.http")


@contextmanager
def replay_server(close: Close = "at_once", answer: Callable[[int, str, int], Recorded | bytes] | None = None,
                  chunk_gap_s: float = 0.0, metrics: list[str] | None = None) -> Iterator[ReplayServer]:
    """The replay server on a free 127.0.0.1 port, its event loop on a background thread.

    ``answer(n, path, in_flight)`` picks the n-th POST's response (default: the recorded stream for its path);
    ``chunk_gap_s`` is slept between a stream's events (0: as fast as the loop writes);
    ``metrics`` are served in turn by ``/metrics`` (the last one repeats; default the recorded idle text).
    """
    state = ReplayServer(metrics_texts=metrics or [fixture_text("metrics-idle.txt")])
    pick = answer or (lambda n, path, in_flight: _stream_for(path))
    loop = asyncio.new_event_loop()
    started = threading.Event()
    server_ref: list[asyncio.base_events.Server] = []

    async def respond(writer: asyncio.StreamWriter, response: Recorded) -> None:
        if not response.is_stream:
            body = response.body()
            connection = b"" if b"\r\nconnection:" in response.head.lower() else b"\r\nKeep-Alive: timeout=5, max=100"
            writer.write(response.head + connection + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                         + body)
            await writer.drain()
            return
        writer.write(response.head + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in response.events:
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
            if chunk_gap_s:
                await asyncio.sleep(chunk_gap_s)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.num_connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                method, path = head.split(b" ", 2)[:2]
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                text_path = path.decode()
                if method == b"GET":
                    await respond(writer, _get(state, text_path))
                    if b"connection: close" in head.lower():
                        return
                    continue
                n = state.num_posts
                state.num_posts += 1
                state.num_in_flight += 1
                try:
                    response = pick(n, text_path, state.num_in_flight)
                    if response == DROP:
                        state.num_closed_unanswered += 1
                        return
                    assert isinstance(response, Recorded)
                    await respond(writer, response)
                finally:
                    state.num_in_flight -= 1
                if not response.is_stream or close == "keep":
                    if b"connection: close" in response.head.lower():
                        return
                    continue
                if close == "after_next_request":
                    try:
                        await reader.readuntil(b"\r\n\r\n")
                        state.num_closed_unanswered += 1
                    except (asyncio.IncompleteReadError, ConnectionError):
                        pass
                return
        except asyncio.CancelledError:
            return  # NOTE: the server is shutting down; returning (not raising) keeps asyncio's callback quiet
        finally:
            writer.close()

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024))
        server_ref.append(server)
        state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the replay server did not start")
    async def shutdown() -> None:
        server_ref[0].close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        loop.stop()

    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(timeout=10)
        loop.close()


def _get(state: ReplayServer, path: str) -> Recorded:
    ok = b"HTTP/1.1 200 OK\r\nServer: llama.cpp"
    if path.startswith("/metrics"):
        text = state.metrics_texts[min(state.num_scrapes, len(state.metrics_texts) - 1)]
        state.num_scrapes += 1
        return Recorded(ok + b"\r\nContent-Type: text/plain; version=0.0.4", [text.encode()], is_stream=False)
    bodies = {"/v1/models": _models_body, "/props": lambda: (FIXTURES / "props.json").read_bytes(),
              "/slots": lambda: (FIXTURES / "slots-idle.json").read_bytes(),
              "/health": lambda: json.dumps({"status": "ok"}).encode()}
    for prefix, body in bodies.items():
        if path.startswith(prefix):
            return Recorded(ok + b"\r\nContent-Type: application/json; charset=utf-8", [body()], is_stream=False)
    return Recorded(b"HTTP/1.1 404 Not Found\r\nServer: llama.cpp\r\nContent-Type: application/json",
                    [b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}'], is_stream=False)
