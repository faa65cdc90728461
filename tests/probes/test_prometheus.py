"""The Prometheus probe against a real local /metrics endpoint, and against one that is down."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from probes.loader import load_table
from probes.prometheus import PrometheusProbe
from probes.run_dir import RunDirectory
from tests.probes.conftest import MetricsServer


def test_scrapes_every_sample_with_its_labels(tmp_path: Path, metrics_server: MetricsServer) -> None:
    run_dir = RunDirectory.create(tmp_path)
    probe = PrometheusProbe(run_dir, metrics_server.url, interval_s=0.01)
    probe.start()
    probe.stop()
    frame = load_table(run_dir, "prometheus", may_be_partial=False).to_pandas()
    assert probe.status.num_errors == 0 and frame["scrape_index"].nunique() >= 2
    last = frame[frame["scrape_index"] == frame["scrape_index"].max()].set_index("sample")
    assert last.loc["test_num_requests_running", "value"] == 3.0
    assert json.loads(last.loc["test_num_requests_running", "labels"]) == {"model_name": "dummy:tiny"}
    assert last.loc["test_num_requests_running", "type"] == "gauge"
    assert last.loc["test_requests_finished_total", "value"] == metrics_server.registry.get_sample_value("test_requests_finished_total")
    assert last.loc["test_requests_finished_total", "family"] == "test_requests_finished"


def test_a_server_that_is_down_is_counted_and_the_run_goes_on(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # NOTE: the socket is closed, so nothing listens on the port now.
    run_dir = RunDirectory.create(tmp_path)
    probe = PrometheusProbe(run_dir, f"http://127.0.0.1:{port}/metrics", interval_s=0.01, timeout_s=2.0)
    probe.start()
    probe.stop()
    assert probe.status.num_errors >= 2 and "URLError" in (probe.status.detail or "")
    assert load_table(run_dir, "prometheus", may_be_partial=False).num_rows == 0


def test_rejects_a_url_that_is_not_http(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="http"):
        PrometheusProbe(RunDirectory.create(tmp_path), "file:///etc/passwd")
