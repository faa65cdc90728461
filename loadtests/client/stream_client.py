"""One Locust user's HTTP connections to the target, and the one retry a keep-alive race deserves.

A request sent on a pooled keep-alive connection can meet a connection the server has just closed:
the server never read it, and the client sees the connection end before any answer. That is our
client's failure, not the server's. llama.cpp's ``llama-server`` closes the connection after every
streamed response although its headers advertise ``Keep-Alive`` (its stream handler tells
cpp-httplib the body was cancelled once it is done), so a client that reuses the connection at once
races the close and sometimes loses. So: a request whose *pooled* connection ended before any byte
of an answer is sent again, once, on a fresh connection, and the retry is recorded (the client row's
``num_retries`` and ``retry_error``). A *fresh* connection that ends without an answer is the
server's doing (it dropped the request) and is a failure, never retried.

Built on the standard library's ``http.client`` (cooperative under Locust's gevent patching): it
says exactly whether a connection is pooled or fresh, and it measured about four times cheaper per
request than ``requests`` (what ``HttpUser`` sends with) on this machine (docs/results.md, "The client's
own ceiling"). An idle connection the server has already closed (its FIN arrived while it sat in the pool)
is dropped before use, as urllib3 does, so only a close that races the request costs a retry.
"""

from __future__ import annotations

import http.client
import select
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

# The exceptions that mean the connection ended before any answer came.
NO_ANSWER = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
# Idle connections kept per client (an open-loop user holds many requests in flight at once).
MAX_IDLE = 1024


class StreamResponse:
    """One answer: its status and headers, and its body read line by line (or whole, for an error)."""

    def __init__(self, response: http.client.HTTPResponse, retry_error: str | None) -> None:
        self._response = response
        self.status_code = int(response.status)
        self.headers = response.headers
        self.retry_error = retry_error  # what the first attempt met, when this answer is the retry's
        self.is_complete = False  # the whole body was read: the connection may carry another request

    def iter_lines(self) -> Iterator[bytes]:
        """The body's lines, split at LF only (as SSE frames them), without their line ends."""
        while True:
            line = self._response.readline()
            if not line:
                self.is_complete = True
                return
            yield line.rstrip(b"\r\n")

    def text(self, limit: int = 1 << 16) -> str:
        body = self._response.read(limit)
        self.is_complete = self._response.isclosed()
        return body.decode("utf-8", errors="replace")


class StreamClient:
    """The connections of one user (or one open-loop sender) to ``base_url``; not shared between processes."""

    def __init__(self, base_url: str, connect_timeout_s: float = 10.0) -> None:
        split = urlsplit(base_url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"the target must be an http(s) URL, got {base_url!r}")
        self._is_https = split.scheme == "https"
        self._host = split.hostname
        self._port = split.port or (443 if self._is_https else 80)
        self._prefix = split.path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self.num_connections = 0  # opened over the client's life
        self.num_retries = 0

    @contextmanager
    def post_stream(self, path: str, body: bytes, headers: dict[str, str],
                    read_timeout_s: float) -> Iterator[StreamResponse]:
        """POST ``body`` and yield the answer; the connection goes back to the pool only if its body was read whole.

        Raises what the connection met when no answer came (after the one retry a pooled connection gets).
        """
        headers = {"Content-Type": "application/json", **headers}
        conn, is_pooled = self._take()
        retry_error = None
        try:
            response = self._send(conn, path, body, headers, read_timeout_s)
        except NO_ANSWER as exc:
            conn.close()
            if not is_pooled:
                raise
            # NOTE: the server closed the pooled connection before it read this request (a keep-alive race).
            retry_error = f"{type(exc).__name__}: {exc}"
            self.num_retries += 1
            conn = self._connect()
            try:
                response = self._send(conn, path, body, headers, read_timeout_s)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()
            raise
        answer = StreamResponse(response, retry_error)
        try:
            yield answer
        finally:
            if answer.is_complete and not response.will_close and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
            else:
                conn.close()

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """``(connection, is_pooled)``: an idle one the server has not closed, else a fresh one."""
        while self._idle:
            conn = self._idle.pop()
            if conn.sock is not None and not _is_readable(conn.sock):
                return conn, True
            conn.close()  # NOTE: readable while idle: the server's FIN (or bytes it had no business sending)
        return self._connect(), False

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def _connect(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._is_https else http.client.HTTPConnection
        conn = kind(self._host, self._port, timeout=self._connect_timeout_s)
        conn.connect()
        # NOTE: small writes (a request head, then its body) must not wait for the server's delayed ACK.
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.num_connections += 1
        return conn

    def _send(self, conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str],
              read_timeout_s: float) -> http.client.HTTPResponse:
        conn.sock.settimeout(read_timeout_s)
        conn.request("POST", self._prefix + path, body=body, headers=headers)
        return conn.getresponse()


def _is_readable(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)
