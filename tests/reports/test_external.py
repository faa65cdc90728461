"""Servers seen from outside: verdicts from client rows, /metrics and sweeps, and how sure they are."""

from __future__ import annotations

from reports.dataset import RunDataset
from reports.verdict.diagnosis import diagnose


def test_an_external_run_has_no_engine_tables(external_dir) -> None:
    data = RunDataset.load(external_dir("metrics-cap"))
    assert not data.has_engine_probes and data.has_prometheus
    assert data.latency_source == "client" and len(data.latencies) > 0


def test_metrics_show_a_queue_with_kv_room_as_batching(external_dir) -> None:
    result = diagnose(external_dir("metrics-cap"))
    assert (result.bottleneck, result.source) == ("batching", "prometheus")
    assert {"server_queue", "server_kv_room"} <= set(result.deciding)


def test_metrics_show_a_full_kv_cache_and_preemptions_as_cache(external_dir) -> None:
    result = diagnose(external_dir("metrics-pool"))
    assert (result.bottleneck, result.source) == ("cache", "prometheus")
    by_name = {e.name: e for e in result.evidence}
    assert by_name["server_kv_full"].passed and by_name["server_preemptions"].passed


def test_a_sweep_with_flat_throughput_rising_ttft_and_steady_tpot_is_batching(external_dir) -> None:
    result = diagnose(external_dir("sweep-cap"))
    assert (result.bottleneck, result.source) == ("batching", "sweep")
    assert set(result.deciding) == {"sweep_throughput_flat", "sweep_ttft_grows", "sweep_tpot_holds"}
    assert [p["label"] for p in result.metrics["points"]] == ["users-1", "users-4", "users-8"]


def test_a_sweep_whose_throughput_grows_is_not_batching(external_dir) -> None:
    result = diagnose(external_dir("sweep-healthy"))
    assert result.bottleneck == "none"
    assert result.metrics["sweep"]["throughput_ratio"] > 1.5
    assert result.confidence_label == "low"


def test_the_thinner_the_evidence_the_lower_the_confidence(external_dir, scenario_dir) -> None:
    """One setting (max_num_seqs=1 under 8 users) seen with engine probes, with /metrics, from the client alone."""
    engine = diagnose(scenario_dir("max-num-seqs-1"))
    metrics = diagnose(external_dir("metrics-cap"))
    client = diagnose(external_dir("client-cap"))
    assert engine.bottleneck == metrics.bottleneck == client.bottleneck == "batching"
    assert client.source == "client" and client.deciding == ["few_streams_decoding"]
    assert engine.confidence > metrics.confidence > client.confidence
    assert client.confidence_label == "low"
