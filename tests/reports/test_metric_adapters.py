"""Other servers' /metrics: each family's names read through the scrape parser the Prometheus probe uses.

The fixtures hold four scrapes each (``# scrape N`` comment lines, which the parser skips) written
from each server's own source; the expected figures below are the fixtures' numbers read by hand.
Each is laid over the client rows of one light external run, as the probe would have written it.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from probes.base import tuples_table
from probes.prometheus import scrape_rows
from probes.run_dir import RunDirectory
from probes.schemas import PROMETHEUS
from reports import write_report
from reports.dataset import RunDataset
from reports.metric_adapters import ADAPTERS, MetricAdapter, adapter_for, get_adapter, register
from reports.summary import point_measures
from reports.verdict.diagnosis import diagnose
from tests.reports.driver import Load, run
from tests.reports.scenarios import SHORT

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
SCRAPE_MARK = re.compile(r"^# scrape \d+\n", flags=re.MULTILINE)

# fixture -> (adapter, mean running, mean waiting, waiting share, KV mean, KV peak, preemptions, finished)
EXPECTED = {
    "vllm": ("vllm", 7.0, 2.0, 0.5, 0.755, 0.97, 5, 11),
    "sglang": ("sglang", 3.5, 2.0, 0.5, 0.63, 0.92, 3, 7),
    "tgi": ("tgi", 2.75, 0.25, 0.25, 1871 / 4096, 3900 / 4096, None, 6),
    "llamacpp": ("llamacpp", 3.25, 1.5, 0.75, 0.6375, 0.95, None, None),
    "llamacpp-no-kv": ("llamacpp", 3.25, 1.5, 0.75, None, None, None, None),
    # Recorded from llama-server itself (tests/peers/record_llama_server.py): idle, four requests in the four
    # slots, after them, six requests on the four slots (two deferred). Current builds export no KV gauge.
    "llamacpp-recorded": ("llamacpp", 2.0, 0.5, 0.25, None, None, None, None),
}


def scrapes(name: str) -> list[str]:
    return SCRAPE_MARK.split((FIXTURES / f"{name}.txt").read_text())[1:]


@pytest.fixture(scope="module")
def light_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One user against an external server, its /metrics probe on (the rows are replaced per fixture)."""
    return run(tmp_path_factory.mktemp("light") / "run", Load(users=1, duration_s=1.5, workload_args=SHORT),
               external=True, metrics=True)


@pytest.fixture
def with_metrics(light_run: Path, tmp_path: Path) -> Callable[[str], Path]:
    """``with_metrics(fixture)``: a copy of the light run whose prometheus table is that fixture's scrapes."""

    def make(name: str) -> Path:
        out = tmp_path / name
        shutil.copytree(light_run, out)
        start, end = RunDataset.load(out).window
        texts = scrapes(name)
        times = np.linspace(start, end, len(texts))
        rows = [row for i, (t, text) in enumerate(zip(times, texts, strict=True))
                for row in scrape_rows(text, float(t), i)]
        RunDirectory(out).write_table("prometheus", tuples_table(PROMETHEUS, rows))
        return out

    return make


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_server_family_is_read_by_its_own_names(with_metrics, name: str) -> None:
    adapter, running, waiting, share, kv_mean, kv_peak, preemptions, finished = EXPECTED[name]
    measures = point_measures(RunDataset.load(with_metrics(name)))
    p = measures.prometheus
    assert p is not None and p.adapter == adapter and p.num_scrapes == 4
    assert (p.mean_running, p.mean_waiting, p.waiting_share) == pytest.approx((running, waiting, share))
    if kv_mean is None:
        assert p.kv_usage_mean is None and p.kv_usage_peak is None and p.names["kv_usage"] is None
    else:
        assert (p.kv_usage_mean, p.kv_usage_peak) == pytest.approx((kv_mean, kv_peak))
    assert p.num_preemptions == preemptions
    assert measures.accounting.server_finished_requests == finished
    assert p.names["waiting"] in ADAPTERS[adapter].waiting


def test_llama_server_counters_give_its_batch_its_token_rates_and_its_longest_sequence(with_metrics) -> None:
    data = RunDataset.load(with_metrics("llamacpp-recorded"))
    p = point_measures(data).prometheus
    assert p is not None
    # Busy slots per decode is a running mean since the start; times n_decode_total it counts busy slot-decodes,
    # which differenced over the window's decodes give its mean batch: idle (0 x 0) to the last (2.89362 x 47).
    assert p.mean_batch == pytest.approx((2.89362 * 47 - 0 * 0) / (47 - 0))
    span = float(np.ptp(data.frame("prometheus")["time"].unique()))
    assert p.output_tokens_per_s == pytest.approx(132 / span) and p.prompt_tokens_per_s == pytest.approx(440 / span)
    assert p.max_sequence_tokens == 129  # n_tokens_max, typed a counter: parsed as llamacpp:n_tokens_max_total


def test_unknown_names_give_no_server_measures_and_no_claim_about_the_queue(with_metrics) -> None:
    path = with_metrics("unknown")
    data = RunDataset.load(path)
    assert data.has_prometheus and point_measures(data).prometheus is None
    result = diagnose(path)
    assert (result.bottleneck, result.source) == ("none", "client")
    assert "every request was admitted" not in result.summary
    assert "queue was not measured" in result.summary and "unknown" in result.summary
    assert "none of its names" in result.metrics["metrics_read"]
    write_report(path)
    report = (path / "report.html").read_text()
    assert "from client data" in report and "none of its names" in report


def test_a_measured_empty_queue_is_the_only_admitted_claim(light_run: Path) -> None:
    """The engine's own vLLM-named /metrics at one user: the queue was measured empty, so saying so is honest."""
    result = diagnose(light_run)
    assert (result.bottleneck, result.source) == ("none", "prometheus")
    assert result.metrics["prometheus"]["adapter"] == "vllm" and result.metrics["prometheus"]["waiting_share"] == 0.0
    assert "every request was admitted" in result.summary and "vllm:num_requests_waiting" in result.summary


def test_a_queue_with_a_full_cache_reads_as_cache_from_sglang_names(with_metrics) -> None:
    result = diagnose(with_metrics("sglang"))
    assert (result.bottleneck, result.source) == ("cache", "prometheus")
    assert {"server_queue", "server_kv_full"} <= set(result.deciding)
    assert "sglang:num_queue_reqs" in result.metrics["metrics_read"]


def test_a_passing_queue_is_reported_as_measured(with_metrics) -> None:
    """TGI's queue gauge above zero in one scrape of four: no finding fires, and the summary says what was seen."""
    result = diagnose(with_metrics("tgi"))
    assert (result.bottleneck, result.source) == ("none", "prometheus")
    assert "25%" in result.summary and "tgi_queue_size" in result.summary
    assert "every request was admitted" not in result.summary


def test_a_queue_without_a_kv_gauge_is_batching_that_does_not_claim_memory_room(with_metrics) -> None:
    result = diagnose(with_metrics("llamacpp-no-kv"))
    assert (result.bottleneck, result.source) == ("batching", "prometheus")
    assert "server_queue" in result.deciding and "server_kv_room" not in result.deciding
    assert "KV cache has room" not in result.summary and "no KV usage" in result.summary


def test_the_most_specific_adapter_wins_and_the_registry_refuses_bad_entries() -> None:
    both = {"vllm:num_requests_waiting", "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"}
    assert adapter_for(both).name == "sglang"
    assert adapter_for({"http_requests_total"}) is None
    with pytest.raises(ValueError, match="already registered"):
        register(MetricAdapter("vllm", running=(), waiting=("x",)))
    with pytest.raises(ValueError, match="needs a queue gauge"):
        MetricAdapter("empty", running=("x",), waiting=())
    with pytest.raises(ValueError, match="registered: "):
        get_adapter("triton")
