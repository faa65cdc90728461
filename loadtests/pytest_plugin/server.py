"""The server under test: the ``--llm-target`` one, or ``servescope serve`` started for the session.

The bundled server is :class:`loadtests.run.server_process.ServerProcess` (plain ``servescope serve``, no
probes): a child in its own process group on a free loopback port, waited for on ``/health`` and
stopped (SIGTERM, then SIGKILL) however the session ends, so a server that cannot start leaves
nothing running.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# NOTE: as loadtests.client.load_context.API_KEY_ENV (not imported: this module loads with the plugin).
API_KEY_ENV = "SERVESCOPE_API_KEY"


class ServerStartError(RuntimeError):
    """The server under test could not be started or reached; the message says why and where its log is."""


@dataclass(frozen=True, slots=True)
class LLMServer:
    """What ``llm_server`` gives a test: where the server answers and what it is."""

    url: str
    model: str | None  # the model name to request; None: the first /v1/models lists
    is_bundled: bool  # True: ``servescope serve`` started by this session; False: ``--llm-target``
    serve_argv: tuple[str, ...] = ()  # the bundled server's flags
    log_path: Path | None = None  # the bundled server's log
    tokenizer: str | None = None  # ``--llm-tokenizer``: the tokenizer to cut prompts with
    api_key: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        if not self.is_bundled:
            return f"server under test: {self.url} (--llm-target)"
        return f"server under test: servescope serve {shlex.join(self.serve_argv)} at {self.url}; log {self.log_path}"


def external_server(url: str, model: str | None, tokenizer: str | None) -> LLMServer:
    """The ``--llm-target`` server, checked once: it must answer ``/v1/models`` (its key from the environment)."""
    from loadtests.run.target import discover_target

    api_key = os.environ.get(API_KEY_ENV) or None
    try:
        target = discover_target(url, model, api_key)
    except ValueError as exc:
        raise ServerStartError(f"--llm-target {url}: {exc}") from exc
    return LLMServer(url=target.url, model=model, is_bundled=False, tokenizer=tokenizer, api_key=api_key)


@contextmanager
def bundled_server(log_dir: Path, serve_argv: list[str], startup_timeout_s: float,
                   tokenizer: str | None = None) -> Iterator[LLMServer]:
    """``servescope serve SERVE_ARGV`` on a free loopback port for the ``with`` block; its log in ``log_dir``."""
    from loadtests.errors import ServerFailedError
    from loadtests.run.server_process import ServerProcess

    process = ServerProcess(log_dir, serve_argv, probed=False)
    with process:
        try:
            process.wait_healthy(startup_timeout_s)
        except ServerFailedError as exc:
            raise ServerStartError(f"servescope serve {shlex.join(serve_argv)} could not start: {exc}") from None
        yield LLMServer(url=process.url, model=None, is_bundled=True, serve_argv=tuple(serve_argv),
                        log_path=process.log_path, tokenizer=tokenizer)
