"""The server's listening socket, made before uvicorn starts (so ``--port 0`` names its port with no race).

NOTE: it is made with ``IPPROTO_TCP`` named. asyncio turns Nagle's algorithm off on each connection it
accepts only when the socket's ``proto`` says TCP, and ``socket.create_server`` leaves it 0: on such a
listener every streamed answer's first event, written just after its headers, waited for the client's
delayed ACK (about 40 ms on Linux), and its tokens came in one burst behind it (docs/results.md,
"Nagle's algorithm on the diagnosed server").
"""

from __future__ import annotations

import socket


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` and listening, whose accepted connections asyncio sets ``TCP_NODELAY`` on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as socket.create_server does
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
