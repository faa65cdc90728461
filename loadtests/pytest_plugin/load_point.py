"""One load point from a test: the keywords of ``llm_load`` made into a :class:`LoadConfig` and run by
``servescope load``'s own orchestrator (:func:`loadtests.run.orchestrator.run_load`) into a run directory.

Locust runs as a child process, as under ``servescope load``; nothing of it is imported into pytest's.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from loadtests.pytest_plugin.results import LoadRun
from loadtests.pytest_plugin.server import LLMServer

# What a test's load point is when it says nothing else: short, since a test suite runs many.
DEFAULT_DURATION_S = 30.0
DEFAULT_WARMUP_S = 5.0
DEFAULT_WORKLOAD = "sharegpt-synth"


class LoadPointError(RuntimeError):
    """The load point could not run (Locust failed, the server went away); the run directory is kept."""


def load_config(users: int | None = None, rate: float | None = None, duration: float = DEFAULT_DURATION_S,
                warmup: float = DEFAULT_WARMUP_S, workload: str = DEFAULT_WORKLOAD, max_tokens: int | None = None,
                seed: int = 0, slo: dict[str, float] | str | None = None, api: str | None = None,
                **more: Any) -> Any:
    """``llm_load``'s keywords as the :class:`~loadtests.config.LoadConfig` that ``servescope load`` builds from
    its flags; ``more`` are other LoadConfig fields (``processes``, ``ignore_eos``, ``burstiness``, ...)."""
    from loadtests.config import LoadConfig, parse_slo

    own = {"users", "rate", "duration_s", "warmup_s", "workload", "seed", "max_tokens", "slo", "api"}
    others = {f.name for f in dataclasses.fields(LoadConfig)} - own - {"master"}
    unknown = sorted(set(more) - others)
    if unknown:
        raise TypeError(f"llm_load got unknown keyword(s) {unknown}; it takes users, rate, duration, warmup, "
                        f"workload, max_tokens, seed, slo, api and {', '.join(sorted(others))}")
    return LoadConfig(users=users, rate=rate, duration_s=float(duration), warmup_s=float(warmup), workload=workload,
                      max_tokens=max_tokens, seed=seed, slo=parse_slo(slo) if isinstance(slo, str) else dict(slo or {}),
                      api=api or ("chat" if workload == "chat-sessions" else "completions"), **more)


def run_load_point(server: LLMServer, out: Path, config: Any, reference: bool = False) -> LoadRun:
    """Load ``server`` at one point into the new directory ``out`` and read the run back.

    A run too broken for a verdict (most requests failed) still returns its :class:`LoadRun`, with
    ``verdict.bottleneck`` None, so a test can assert on its failures. ``reference=True`` also times the
    target's decode step against ``servescope serve`` on the same weights, as ``servescope load`` does (a
    second server start per point).
    """
    from rich.console import Console

    from loadtests.errors import NoVerdictError, RunFailedError
    from loadtests.run.orchestrator import run_load

    # NOTE: pytest captures stderr (a failed test shows it); rich would cut the table to 80 columns there.
    console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)
    try:
        run_load([config], out, server.url, console, tokenizer_name=server.tokenizer, served_model=server.model,
                 api_key=server.api_key, reference=reference)
    except NoVerdictError:
        pass  # NOTE: summary.json and diagnosis.json are written; the LoadRun says there is no verdict
    except (RunFailedError, ValueError) as exc:
        raise LoadPointError(f"the load point {config.point_name} against {server.url} failed: {exc} "
                             f"(run directory {out})") from exc
    return LoadRun.from_run_dir(out)
