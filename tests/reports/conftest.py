"""Shared runs: each scenario, ablation and external run is driven once per session, on first use."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from reports.ablation import STANDARD_VARIANTS, write_ablation_index
from tests.reports.agreement import AGREEMENT, run_agreement
from tests.reports.driver import Load, run, run_sweep
from tests.reports.scenarios import SCENARIOS, SHORT, run_scenario

MARKUP_PROMPT = "<script>alert(1)</script> & <b>bold</b> \"quoted\" prompt"
# Every variant shares one engine config and load and switches one lever off. The pool is sized
# so that max-length reservations bind (4 of 8 requests fit) while pages do not (8 fit easily).
ABLATION_BASE = {"num_kv_blocks": 128, "max_model_len": 512}
ABLATION_ENGINES = {"continuous": ({}, "continuous"), "no-batching": ({"max_num_seqs": 1}, "continuous"),
                    "contiguous": ({"kv_layout": "contiguous"}, "continuous"),
                    "eager": ({"execution": "eager"}, "continuous"),
                    "torch-attention": ({"attention_backend": "torch"}, "continuous"),
                    "bfloat16": ({"dtype": "bfloat16"}, "continuous"),
                    "int8": ({"dtype": "bfloat16", "weights": "int8"}, "continuous"),
                    "int4": ({"dtype": "bfloat16", "weights": "int4"}, "continuous"),
                    "naive": ({}, "naive")}
ABLATION_LOAD = Load(users=8, duration_s=2.0, workload_args=SHORT)


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("report-runs")


@pytest.fixture(scope="session")
def scenario_dir(runs_root: Path) -> Callable[[str], Path]:
    """``scenario_dir(name)``: the run directory of that scenario, driven on first request."""
    by_name = {s.name: s for s in SCENARIOS}
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = run_scenario(by_name[name], runs_root / "scenarios" / name)
        return done[name]

    return get


@pytest.fixture(scope="session")
def markup_run(runs_root: Path) -> Path:
    """A short batching-bound run whose slowest request's prompt is HTML markup (no warm-up, so it is measured)."""
    load = Load(users=4, warmup_s=0.0, duration_s=1.5, workload_args=SHORT, prompts=((MARKUP_PROMPT, 160),))
    return run(runs_root / "markup", load, {"max_num_seqs": 2})


@pytest.fixture(scope="session")
def ablation_dir(runs_root: Path) -> Path:
    """The standard ablation variants, each one point of the same load, indexed by ablation.json."""
    root = runs_root / "ablation"
    for variant in STANDARD_VARIANTS:
        engine, kind = ABLATION_ENGINES[variant.name]
        run(root / variant.dir, ABLATION_LOAD, {**ABLATION_BASE, **engine}, kind)
    write_ablation_index(root, STANDARD_VARIANTS)
    return root


@pytest.fixture(scope="session")
def external_dir(runs_root: Path) -> Callable[[str], Path]:
    """External-server runs (no engine probes), by name, driven on first request."""
    one_seq = {"max_num_seqs": 1}
    makers: dict[str, Callable[[Path], Path]] = {
        "metrics-cap": lambda p: run(p, Load(users=8, workload_args=SHORT), one_seq, external=True, metrics=True),
        "metrics-pool": lambda p: run(p, Load(users=16, workload_args={"prompt_tokens": 64, "output_tokens": 64}),
                                      {"num_kv_blocks": 64, "max_model_len": 256}, external=True, metrics=True),
        "client-cap": lambda p: run(p, Load(users=8, workload_args=SHORT), one_seq, external=True),
        # NOTE: 5 ms of host work per step in both sweeps, so that the server's own steps, not the client's share
        # of the same two cores, set TPOT, TTFT and throughput: on a tiny model a loaded machine moved the sweep's
        # ratios past their thresholds (the verdict then came from the client's stream count, not the sweep;
        # the healthy sweep's throughput once grew less than 1.5x from 1 to 8 users).
        "sweep-cap": lambda p: run_sweep(p, [1, 4, 8], Load(duration_s=1.5, workload_args=SHORT),
                                         {**one_seq, "host_overhead_ms": 5.0}, external=True),
        "sweep-healthy": lambda p: run_sweep(p, [1, 4, 8], Load(duration_s=1.5, workload_args=SHORT),
                                             {"host_overhead_ms": 5.0}, external=True),
    }
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = makers[name](runs_root / "external" / name)
        return done[name]

    return get


@pytest.fixture(scope="session")
def agreement_dir(runs_root: Path) -> Callable[[str], Path]:
    """``agreement_dir(name)``: that agreement scenario's run (engine probes and /metrics), driven on first request."""
    by_name = {s.name: s for s in AGREEMENT}
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = run_agreement(by_name[name], runs_root / "agreement" / name)
        return done[name]

    return get
