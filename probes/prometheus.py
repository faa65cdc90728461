"""Scrape an external server's Prometheus ``/metrics`` on an interval into rows."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from probes import schemas
from probes.base import tuples_table
from probes.run_dir import RunDirectory
from probes.sampler import SamplerProbe


class PrometheusProbe(SamplerProbe):
    """One row per sample per scrape (``family``, ``sample`` name, JSON ``labels``, ``value``).

    A scrape that fails (server down, bad text) is counted in the status, its first error kept
    as the detail, and the probe keeps scraping: a server that comes up late is still recorded.
    """

    name = "prometheus"
    schema = schemas.PROMETHEUS

    def __init__(self, run_dir: RunDirectory, url: str, interval_s: float = 1.0, timeout_s: float = 5.0) -> None:
        super().__init__(run_dir, interval_s)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.status.settings.update(url=url, timeout_s=timeout_s)
        self._num_scrapes = 0

    def _open(self) -> bool:
        return True

    def _sample(self) -> None:
        now = time.time()
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:  # noqa: S310 - http(s) only
            text = response.read().decode("utf-8")
        scrape = self._num_scrapes
        self._num_scrapes += 1
        self._record_many(scrape_rows(text, now, scrape))

    def _to_table(self, rows: list[tuple[Any, ...]], is_final: bool) -> pa.Table:
        return tuples_table(self.schema, rows)


def scrape_rows(text: str, time_s: float, scrape_index: int) -> list[tuple[Any, ...]]:
    """The rows of one scrape's exposition ``text`` (schemas.PROMETHEUS): one per sample, labels as JSON."""
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = json.dumps(dict(sample.labels), sort_keys=True)
            rows.append((time_s, scrape_index, family.name, family.type, sample.name, labels, float(sample.value)))
    return rows
