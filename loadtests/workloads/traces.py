"""Request traces from production serving, read as their publishers document them.

- Mooncake (kvcache-ai/Mooncake, ``FAST25-release/traces``): JSON lines ``{"timestamp": ms,
  "input_length": tokens, "output_length": tokens, "hash_ids": [...]}``. Each hash id names one
  512-token block of the prompt; requests that share a hash id share that block (a common prefix).
- BurstGPT (HPMLL/BurstGPT, ``data/BurstGPT_*.csv``): ``Timestamp`` (seconds from the trace's start),
  ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``. Rows with
  0 response tokens are failed requests in the original log and are skipped.
- Azure LLM inference (Azure/AzurePublicDataset, ``AzureLLMInferenceTrace_{code,conv}.csv``):
  ``TIMESTAMP`` (a date-time), ``ContextTokens``, ``GeneratedTokens``.

The format is chosen from the file: ``.jsonl`` is Mooncake; a CSV by its header.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

# Mooncake's hash ids each cover this many prompt tokens (its README: "block size 512").
MOONCAKE_BLOCK_TOKENS = 512
TRACE_PREFIX = "trace:"
# Bundled samples, named like real traces' formats; `--workload trace:sample-mooncake` and so on.
SAMPLES = {"sample-mooncake": "mooncake_sample.jsonl", "sample-burstgpt": "burstgpt_sample.csv",
           "sample-azure": "azure_sample.csv"}


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request of a trace: when it arrived (seconds after the first), its lengths, its prefix blocks."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def trace_path(spec: str) -> Path:
    """The file of ``trace:FILE`` (or of a bundled sample's name); ValueError if there is none."""
    name = spec.removeprefix(TRACE_PREFIX)
    if not name:
        raise ValueError("--workload trace:FILE needs a file: trace:requests.jsonl (Mooncake), "
                         f"a BurstGPT or Azure CSV, or a bundled sample ({', '.join(SAMPLES)})")
    if name in SAMPLES:
        return Path(str(resources.files("loadtests.workloads").joinpath(f"data/traces/{SAMPLES[name]}")))
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"trace file {name!r} does not exist (bundled samples: {', '.join(SAMPLES)})")
    return path


def read_trace(path: str | Path, time_scale: float = 1.0, max_requests: int | None = None) -> list[TraceRequest]:
    """The requests of a trace file in arrival order, the first at 0 s, gaps multiplied by ``time_scale``."""
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0 (2 replays at half speed), got {time_scale}")
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {max_requests}")
    path = Path(path)
    rows = list(_read_jsonl(path) if path.suffix == ".jsonl" else _read_csv(path))
    if not rows:
        raise ValueError(f"{path} holds no requests")
    rows.sort(key=lambda r: r.arrival_s)
    if max_requests is not None:
        rows = rows[:max_requests]
    start = rows[0].arrival_s
    return [TraceRequest((r.arrival_s - start) * time_scale, r.input_tokens, r.output_tokens, r.hash_ids)
            for r in rows]


def _read_jsonl(path: Path) -> Iterator[TraceRequest]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                yield TraceRequest(float(row["timestamp"]) / 1000.0, _positive(row["input_length"]),
                                   _positive(row["output_length"]),
                                   tuple(int(h) for h in row.get("hash_ids", [])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: not a Mooncake trace line (timestamp ms, input_length, "
                                 f"output_length, hash_ids): {exc}") from exc


def _read_csv(path: Path) -> Iterator[TraceRequest]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        header = set(reader.fieldnames or [])
        if {"Timestamp", "Request tokens", "Response tokens"} <= header:
            parse = _burstgpt_row
        elif {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
            parse = _azure_row
        else:
            raise ValueError(f"{path}: neither a BurstGPT CSV (Timestamp, Request tokens, Response tokens, ...) "
                             f"nor an Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens); "
                             f"header {sorted(header)}")
        for number, row in enumerate(reader, 2):
            try:
                request = parse(row)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from exc
            if request is not None:
                yield request


def _burstgpt_row(row: dict[str, str]) -> TraceRequest | None:
    if int(row["Response tokens"]) == 0:
        return None  # a failed request in the original log
    return TraceRequest(float(row["Timestamp"]), _positive(row["Request tokens"]), _positive(row["Response tokens"]))


def _azure_row(row: dict[str, str]) -> TraceRequest:
    return TraceRequest(_azure_time(row["TIMESTAMP"]), _positive(row["ContextTokens"]),
                        _positive(row["GeneratedTokens"]))


def _azure_time(text: str) -> float:
    """Seconds since the epoch of Azure's ``2023-11-16 18:15:46.6805900`` (7 fractional digits)."""
    whole, _, fraction = text.strip().partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def _positive(value: object) -> int:
    number = int(value)  # type: ignore[call-overload]
    if number < 1:
        raise ValueError(f"token counts must be >= 1, got {number}")
    return number
