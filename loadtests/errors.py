"""What a load run that started but broke raises; the CLI turns each into exit status 1 and its message."""

from __future__ import annotations


class RunFailedError(RuntimeError):
    """A run could not finish; the message says what broke and which log to read."""


class ServerFailedError(RunFailedError):
    """The server process exited, or never became healthy; the message carries its log's tail."""


class LocustFailedError(RunFailedError):
    """Locust exited with an error; the message carries its log's tail."""


class WorkersMissingError(RunFailedError):
    """A Locust master gave up waiting for its workers; the message says how many came."""


class NoVerdictError(RunFailedError):
    """The run and its report are written, but too many requests failed for a verdict."""


class ReportFailedError(RunFailedError):
    """The run is written, but its summary or report could not be."""
