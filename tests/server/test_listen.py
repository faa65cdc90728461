"""The server's listener: every connection asyncio accepts on it has Nagle's algorithm off."""

from __future__ import annotations

import asyncio
import socket

import pytest

from engine.server.listen import listening_socket


async def _accepted_nodelay(listener: socket.socket) -> int:
    """TCP_NODELAY on the server side of one connection accepted by asyncio (as uvicorn accepts)."""
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=listener)
    port = listener.getsockname()[1]
    async with server:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(accepted, 10)
        writer.close()
    return value


def test_connections_accepted_on_the_listener_send_small_writes_at_once() -> None:
    listener = listening_socket("127.0.0.1", 0)
    assert listener.proto == socket.IPPROTO_TCP
    assert asyncio.run(_accepted_nodelay(listener)) != 0


def test_a_listener_without_the_protocol_named_leaves_nagle_on() -> None:
    # NOTE: the cause the listener exists for: asyncio sets TCP_NODELAY only when the socket's proto says TCP
    assert asyncio.run(_accepted_nodelay(socket.create_server(("127.0.0.1", 0)))) == 0


def test_the_listener_takes_a_free_port_and_refuses_a_taken_one() -> None:
    listener = listening_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    assert port > 0
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # NOTE: listening before uvicorn starts: a client may connect at once
        with pytest.raises(OSError):
            listening_socket("127.0.0.1", port)
    finally:
        listener.close()
