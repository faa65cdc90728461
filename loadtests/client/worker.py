"""``servescope worker``: one Locust worker that joins a ``servescope load --master`` from any machine.

It needs only where the master is: the plan, target, seed and every load setting come from the
master when the test starts, and its client rows go back to the master (:mod:`loadtests.client.relay`),
so nothing is read from or written to this machine's disk. The command becomes Locust's worker
process (``exec``), so stopping or killing it stops the worker itself, and the master counts it
lost. It ends when the master says the run is over; Locust bounds its waits: it gives up on a
master that does not answer within ``CONNECT_TIMEOUT * CONNECT_RETRY_COUNT`` seconds (300), and
on one that stops sending heartbeats for ``MASTER_HEARTBEAT_TIMEOUT`` (60).

The target's API key, when it needs one, comes from this machine's ``$SERVESCOPE_API_KEY``: the
master never sends it over the wire.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from loadtests.config import DEFAULT_MASTER_PORT, LOCUSTFILE


def worker_command(master_host: str, master_port: int) -> list[str]:
    """Locust's worker over our locustfile, joining the master at ``master_host:master_port``."""
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker", "--master-host", master_host,
            "--master-port", str(master_port), "--loglevel", "INFO"]


def _cmd_worker(args: argparse.Namespace) -> int:
    if not 1 <= args.master_port <= 65535:
        raise ValueError(f"--master-port must be in 1..65535, got {args.master_port}")
    try:
        socket.getaddrinfo(args.master_host, args.master_port)
    except socket.gaierror as exc:
        raise ValueError(f"--master-host {args.master_host!r} does not resolve: {exc.strerror}") from None
    print(f"servescope worker: joining the master at {args.master_host}:{args.master_port}", file=sys.stderr,
          flush=True)
    argv = worker_command(args.master_host, args.master_port)
    os.execv(argv[0], argv)  # NOTE: never returns; Locust's exit status is the command's
    return 1


def register_worker(subparsers: Any) -> None:
    """Add ``servescope worker``."""
    p = subparsers.add_parser(
        "worker", help="join a `servescope load --master` run as one of its Locust workers, from any machine",
        description="Run one Locust worker for a `servescope load --master` run. The plan, target and load "
                    "settings come from the master; this worker's client rows go back to it. It needs the "
                    "master's port and the target reachable from here; the target's API key, if any, is read "
                    "from $SERVESCOPE_API_KEY here.")
    p.add_argument("--master-host", required=True, help="host name or address of the machine running the master")
    p.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT,
                   help="the master's --master-bind-port (default %(default)s)")
    p.set_defaults(func=_cmd_worker)
