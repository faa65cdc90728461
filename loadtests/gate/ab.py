"""Run two builds, or two engine configurations of one build, interleaved on the same requests.

Each side is a long-lived worker process (``loadtests/gate/worker.py``) with its build's tree first on
``PYTHONPATH``: the same driver loop for both, the build's own engine underneath. A round sends one
seeded set of requests to both sides, one after the other; the order alternates (base first on even
rounds, candidate first on odd ones: ABBA), so the slow drift of a shared machine's load cancels in
pairs of rounds. Every round draws fresh requests (seed + round), so no round is served from the
prefix cache of an earlier one, and both sides of a round do exactly the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from engine.config import EngineConfig
from engine.flags import add_engine_args, engine_config_from_args
from loadtests.workloads.catalog import WORKLOADS, make_workload

WORKER = Path(__file__).with_name("worker.py")
START_TIMEOUT_S = 600.0
ROUND_TIMEOUT_S = 900.0


@dataclass(slots=True)
class SideSpec:
    """What one side runs: a source tree holding ``engine/``, and engine flags."""

    label: str
    tree: Path
    flags: list[str]
    ref: str | None = None  # the git ref the tree was taken from, if any

    def describe(self) -> str:
        where = f"{self.ref} " if self.ref else ""
        return f"{where}{shlex.join(self.flags) or '(engine defaults)'}"


@dataclass(slots=True)
class SideRecord:
    """What one side did over the measured rounds."""

    spec: SideSpec
    config: dict[str, Any] = field(default_factory=dict)
    round_s: list[float] = field(default_factory=list)  # wall time
    round_cpu_s: list[float] = field(default_factory=list)  # the worker's CPU time
    num_output_tokens: list[int] = field(default_factory=list)
    step_tables: list[pd.DataFrame] = field(default_factory=list)

    def steps(self) -> pd.DataFrame:
        """Every measured step, with the round it belongs to."""
        return pd.concat(self.step_tables, ignore_index=True)


@dataclass(slots=True)
class ABRun:
    base: SideRecord
    candidate: SideRecord
    workload: dict[str, Any]

    def ratios(self, clock: str = "wall") -> list[float]:
        """``candidate / base`` round time on ``clock`` (wall or cpu), one per round: the paired measure."""
        base, candidate = ((self.base.round_s, self.candidate.round_s) if clock == "wall"
                           else (self.base.round_cpu_s, self.candidate.round_cpu_s))
        return [c / b for b, c in zip(base, candidate, strict=True)]


class WorkerError(RuntimeError):
    """A side's worker failed or said its input was bad."""


class Worker:
    """One side's process; :meth:`call` sends a request and waits for its reply."""

    def __init__(self, spec: SideSpec) -> None:
        self.spec = spec
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(spec.tree), os.environ.get("PYTHONPATH", "")])}
        # NOTE: -P keeps this file's own directory off sys.path; the tree on PYTHONPATH comes before any install.
        self.process = subprocess.Popen([sys.executable, "-P", str(WORKER)], cwd=spec.tree, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def receive(self, timeout_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            state = f"no reply in {timeout_s:.0f} s" if not ready else f"exited with {self.process.poll()}"
            raise WorkerError(f"{self.spec.label} worker ({self.spec.tree}): {state}")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(f"{self.spec.label}: {reply['error']}")
        return reply

    def call(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.send(message)
        return self.receive(timeout_s)

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _start(workers: dict[str, Worker]) -> dict[str, dict[str, Any]]:
    """Build every side's engine at once (model loads overlap); each side's config."""
    for worker in workers.values():
        worker.send({"op": "start", "flags": worker.spec.flags})
    configs = {}
    for name, worker in workers.items():
        hello = worker.receive(START_TIMEOUT_S)
        engine_file = Path(hello["engine_file"]).resolve()
        if not engine_file.is_relative_to(worker.spec.tree.resolve()):
            raise WorkerError(f"{worker.spec.label}: imported engine from {engine_file}, not from {worker.spec.tree}")
        configs[name] = hello["config"]
    return configs


def run_ab(base: SideSpec, candidate: SideSpec, *, workload: str = "mixed", num_prompts: int = 16,
           concurrency: int = 16, max_tokens: int | None = 32, seed: int = 0, rounds: int = 20,
           warmup_rounds: int = 1) -> ABRun:
    """Warm both sides up, then run ``rounds`` measured rounds, alternating which side goes first."""
    from loadtests.workloads.tokenizer import load_tokenizer

    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(sorted(WORKLOADS))}")
    models = {_model_of(base.flags), _model_of(candidate.flags)}
    if len(models) != 1:
        raise ValueError(f"both sides must serve the same model, got {sorted(models)}")
    tokenizer = load_tokenizer(models.pop())
    plan = make_workload(workload, **({"max_output_tokens": max_tokens} if max_tokens else {}))
    records = {"base": SideRecord(base), "candidate": SideRecord(candidate)}
    workers: dict[str, Worker] = {}
    try:
        for name, spec in (("base", base), ("candidate", candidate)):
            workers[name] = Worker(spec)
        for name, config in _start(workers).items():
            records[name].config = config
        for r in range(-warmup_rounds, rounds):
            items = [[i.prompt_token_ids, i.max_tokens]
                     for i in plan.items(num_prompts, tokenizer, seed + r + warmup_rounds)]
            order = ("base", "candidate") if r % 2 == 0 else ("candidate", "base")
            for name in order:
                reply = workers[name].call({"op": "round", "items": items, "concurrency": concurrency},
                                           ROUND_TIMEOUT_S)
                if r >= 0:
                    _record(records[name], reply, r)
    finally:
        for worker in workers.values():
            worker.close()
    base_rec, cand_rec = records["base"], records["candidate"]
    if base_rec.num_output_tokens != cand_rec.num_output_tokens:
        raise WorkerError(f"the sides produced different output token counts per round: "
                          f"{base_rec.num_output_tokens} vs {cand_rec.num_output_tokens}")
    return ABRun(base_rec, cand_rec, {"workload": workload, "num_prompts": num_prompts,
                                      "concurrency": concurrency, "max_tokens": max_tokens, "seed": seed,
                                      "rounds": rounds, "warmup_rounds": warmup_rounds})


def _record(record: SideRecord, reply: dict[str, Any], round_index: int) -> None:
    record.round_s.append(reply["elapsed_s"])
    record.round_cpu_s.append(reply["cpu_s"])
    record.num_output_tokens.append(reply["num_output_tokens"])
    record.step_tables.append(pd.DataFrame(reply["steps"]).assign(round=round_index))


class _FlagParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def engine_config_of(flags: list[str]) -> EngineConfig:
    """The config a side's engine flags describe, checked as this build checks them (ValueError if bad)."""
    parser = _FlagParser(prog="engine flags", add_help=False)
    add_engine_args(parser)
    try:
        return engine_config_from_args(parser.parse_args(flags))
    except ValueError as exc:
        raise ValueError(f"bad engine flags {shlex.join(flags)!r}: {exc}") from None


def _model_of(flags: list[str]) -> str:
    """The ``--model`` a side's flags name (the engine's default when none); other flags are the side's own."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model", default=EngineConfig().model)
    return parser.parse_known_args(flags)[0].model


def installed_tree() -> Path:
    """The tree this servescope runs from (its ``engine`` package's parent)."""
    import engine

    return Path(engine.__file__).resolve().parent.parent


@contextmanager
def tree_at_ref(ref: str, repo: Path) -> Iterator[Path]:
    """The files of ``ref`` in ``repo`` (``git archive``), in a temporary directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="servescope-ab-") as tmp:
        archive = Path(tmp) / "tree.tar"
        done = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", "-o", str(archive), ref],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"cannot read {ref!r} from the git repository {repo}: {done.stderr.strip()}")
        tree = Path(tmp) / "tree"
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        if not (tree / "engine" / "__init__.py").is_file():
            raise ValueError(f"{ref!r} in {repo} has no engine/ package: not a servescope tree")
        yield tree


def repo_root(path: Path) -> Path:
    """The git work tree holding ``path``."""
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"{path} is not in a git work tree (--ab REF compares against a git ref): "
                         f"{done.stderr.strip()}")
    return Path(done.stdout.strip())
