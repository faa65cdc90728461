"""Ablations: the same workload with each lever switched off in turn, side by side.

An ablation directory holds one run directory per variant and ``ablation.json`` naming them::

    {"baseline": "continuous",
     "variants": [{"name": "continuous", "dir": "continuous", "lever": null, "description": "..."}, ...]}

:func:`write_ablation_index` writes that file; the orchestrator runs one load point per variant
(``STANDARD_VARIANTS`` lists the usual ones with the ``serve`` flags that make each) and then calls
``reports.write_report(out)``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.run_dir import ABLATION_NAME, RunDirectory, RunFileError
from reports.dataset import DatasetError, RunDataset, load_points
from reports.measures import client_measures

NAIVE = "naive"


@dataclass(frozen=True, slots=True)
class AblationVariant:
    """One variant: ``lever`` is the lever it changes (None: every lever on, as served; "all": the raw framework).

    Most variants switch one lever off; the ``execution`` variants that change the numbers the
    GEMMs read (``bfloat16``, ``int8``, ``int4``) switch a faster form on instead.
    """

    name: str
    lever: str | None
    description: str = ""
    serve_flags: tuple[str, ...] = ()

    @property
    def dir(self) -> str:
        return self.name


STANDARD_VARIANTS: tuple[AblationVariant, ...] = (
    AblationVariant("continuous", None, "every lever on: continuous batching, paged KV, optimized execution"),
    AblationVariant("no-batching", "batching", "max_num_seqs=1: one request at a time through the engine",
                    ("--max-num-seqs", "1")),
    AblationVariant("contiguous", "cache", "kv_layout=contiguous: max-length KV reservations instead of pages",
                    ("--kv-layout", "contiguous")),
    AblationVariant("eager", "execution", "execution=eager: plain torch ops, no fused kernels or graphs",
                    ("--execution", "eager")),
    AblationVariant("torch-attention", "execution", "attention_backend=torch: decode attention over a gathered, "
                    "padded batch in torch ops instead of the CPU's C kernel (on GPU: instead of Triton)",
                    ("--attention-backend", "torch")),
    AblationVariant("bfloat16", "execution", "dtype=bfloat16: half the weight bytes per step (AVX512-BF16/AMX "
                    "GEMMs where the CPU has them)", ("--dtype", "bfloat16")),
    AblationVariant("int8", "execution", "weights=int8 with bfloat16 activations: weight-only int8 GEMMs",
                    ("--dtype", "bfloat16", "--weights", "int8")),
    AblationVariant("int4", "execution", "weights=int4 with bfloat16 activations: the GGUF's own 4-bit groups",
                    ("--dtype", "bfloat16", "--weights", "int4")),
    AblationVariant(NAIVE, "all", "HF transformers one request at a time: the raw framework",
                    ("--engine", "naive")),
)


@dataclass(slots=True)
class AblationIndex:
    """``ablation.json``: the variants run into one directory each, and which one is the baseline."""

    baseline: str
    variants: list[AblationVariant]

    @property
    def baseline_dir(self) -> str:
        return next(v.dir for v in self.variants if v.name == self.baseline)

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline,
                "variants": [{"name": v.name, "dir": v.dir, "lever": v.lever, "description": v.description,
                              "serve_flags": list(v.serve_flags)} for v in self.variants]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AblationIndex:
        try:
            variants = [AblationVariant(v["name"], v.get("lever"), v.get("description", ""),
                                        tuple(v.get("serve_flags", ()))) for v in data["variants"]]
            index = cls(str(data["baseline"]), variants)
            index.baseline_dir  # noqa: B018 - checks the baseline is one of the variants
        except (KeyError, TypeError, StopIteration) as exc:
            raise RunFileError(f"{ABLATION_NAME} is malformed: {type(exc).__name__}: {exc}") from exc
        return index


def write_ablation_index(out: str | os.PathLike[str], variants: Sequence[AblationVariant],
                         baseline: str = "continuous") -> Path:
    """Write ``out/ablation.json`` for variants already run into ``out/<variant.name>/``."""
    names = [v.name for v in variants]
    if baseline not in names:
        raise ValueError(f"the baseline {baseline!r} is not one of the variants {names}")
    return RunDirectory(out).save(ABLATION_NAME, AblationIndex(baseline, list(variants)))


def read_ablation_index(path: str | os.PathLike[str]) -> AblationIndex | None:
    try:
        return RunDirectory(path).load(ABLATION_NAME, AblationIndex)
    except RunFileError as exc:
        raise DatasetError(str(exc)) from exc


@dataclass(slots=True)
class AblationRow:
    """One variant's throughput and latency percentiles, with ratios to the full engine and to naive."""

    name: str
    lever: str | None
    description: str
    num_requests: int
    output_throughput: float | None
    request_throughput: float | None
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    tpot_p99: float | None
    e2e_p50: float | None
    throughput_vs_baseline: float | None = None
    ttft_vs_baseline: float | None = None
    tpot_vs_baseline: float | None = None
    throughput_vs_naive: float | None = None
    bottleneck: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class AblationTable:
    baseline: str
    rows: list[AblationRow]

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AblationTable:
        return cls(data["baseline"], [AblationRow(**row) for row in data["rows"]])


def ablation_table(path: str | os.PathLike[str],
                   verdict: Callable[[RunDataset], str] | None = None) -> AblationTable | None:
    """The ablation table of the directory at ``path`` (None when it is not an ablation directory).

    A variant whose directory is a sweep is measured at its heaviest point; ``verdict`` (the
    diagnosis) names each variant's bottleneck.
    """
    index = read_ablation_index(path)
    if index is None:
        return None
    rows = []
    for variant in index.variants:
        try:
            points = load_points(Path(path) / variant.dir)
        except DatasetError as exc:
            raise DatasetError(f"ablation variant {variant.name!r}: {exc}") from exc
        point = max(points, key=lambda p: p.concurrency or 0.0)
        c = client_measures(point)

        def stat(dist: dict[str, float] | None, key: str) -> float | None:
            return dist[key] if dist else None

        rows.append(AblationRow(
            name=variant.name, lever=variant.lever, description=variant.description,
            num_requests=c.num_ok if c else 0, output_throughput=c.output_throughput if c else None,
            request_throughput=c.request_throughput if c else None,
            ttft_p50=stat(c.ttft_s if c else None, "p50"), ttft_p90=stat(c.ttft_s if c else None, "p90"),
            ttft_p99=stat(c.ttft_s if c else None, "p99"), tpot_p50=stat(c.tpot_s if c else None, "p50"),
            tpot_p90=stat(c.tpot_s if c else None, "p90"), tpot_p99=stat(c.tpot_s if c else None, "p99"),
            e2e_p50=stat(c.e2e_s if c else None, "p50"),
            bottleneck=verdict(point) if verdict is not None else None))
    by_name = {r.name: r for r in rows}
    base, naive = by_name.get(index.baseline), by_name.get(NAIVE)
    for row in rows:
        if base is not None:
            row.throughput_vs_baseline = _ratio(row.output_throughput, base.output_throughput)
            row.ttft_vs_baseline = _ratio(row.ttft_p50, base.ttft_p50)
            row.tpot_vs_baseline = _ratio(row.tpot_p50, base.tpot_p50)
        if naive is not None:
            row.throughput_vs_naive = _ratio(row.output_throughput, naive.output_throughput)
    return AblationTable(index.baseline, rows)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
