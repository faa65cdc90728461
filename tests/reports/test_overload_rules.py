"""The readings a server gets from outside when the load presses it: a saturated device, a serial server that
never streams two at once, and failures by kind; each decided on measures laid out as a real run's."""

from __future__ import annotations

import dataclasses

import pytest

from probes.server_info import ServerInfo
from reports.capacity.knee import KneeFit
from reports.capacity.limit import is_serial
from reports.capacity.records import Capacity
from reports.failures import FailureCounts
from reports.measures import ClientMeasures
from reports.metric_adapters import PrometheusMeasures
from reports.verdict.diagnosis import decide
from reports.verdict.evidence import Facts

NO_KNEE = KneeFit(None, None, None, None, None, None, False, "no knee")


def _client(tpot_p50_s: float, in_flight: float, decoding: float, num_requests: int = 100) -> ClientMeasures:
    tpot = {"mean": tpot_p50_s, "p50": tpot_p50_s, "p90": tpot_p50_s, "p95": tpot_p50_s, "p99": tpot_p50_s,
            "max": tpot_p50_s, "count": num_requests}
    return ClientMeasures(source="client", num_requests=num_requests, num_ok=num_requests, num_failed=0, window_s=15.0,
                          request_throughput=None, output_throughput=decoding / tpot_p50_s, ttft_s=None, tpot_s=tpot,
                          itl_s=None, e2e_s=None, in_flight=in_flight, decoding_streams=decoding, goodput=None)


def _llama_metrics(running: float, waiting: float) -> PrometheusMeasures:
    return PrometheusMeasures(num_scrapes=15, mean_running=running, mean_waiting=waiting,
                              waiting_share=1.0 if waiting else 0.0, kv_usage_mean=None, kv_usage_peak=None,
                              num_preemptions=None, adapter="llamacpp",
                              names={"running": "llamacpp:requests_processing", "waiting": "llamacpp:requests_deferred"})


def _facts(client: ClientMeasures, prometheus: PrometheusMeasures | None, alone_s: float | None,
           failures: FailureCounts | None = None, slots: int | None = None) -> Facts:
    info = ServerInfo(props={"total_slots": slots, "default_generation_settings": {"n_ctx": 4096}}) if slots else None
    return Facts(server=None, client=client, prometheus=prometheus, roofline=None, single_stream_tpot_s=alone_s,
                 failures=failures or FailureCounts(num_requests=client.num_requests), server_info=info)


def test_every_stream_decoding_and_each_several_times_slower_than_alone_is_execution() -> None:
    # llama-server, 16 slots and 16 users on 2 cores: nothing deferred, TPOT 4x its single stream.
    facts = _facts(_client(0.040, in_flight=16.0, decoding=15.2), _llama_metrics(16.0, 0.0), alone_s=0.010, slots=16)
    result = decide(facts)
    assert result.bottleneck == "execution" and "tpot_over_single_stream" in result.deciding
    assert "4x slower than alone" in result.summary
    # Without /metrics the client's own view decides the same.
    assert decide(dataclasses.replace(facts, prometheus=None)).bottleneck == "execution"


@pytest.mark.parametrize(("tpot_s", "waiting", "alone_s", "expected"), [
    (0.013, 0.0, 0.010, "none"),  # two users on eight slots: each stream near its lone speed
    (0.040, 6.0, 0.010, "batching"),  # requests deferred: seats, whatever each stream's speed
    (0.040, 0.0, None, "none"),  # no single stream measured in this run: the ratio is unknown, no claim
])
def test_slower_streams_alone_do_not_make_execution(tpot_s: float, waiting: float, alone_s: float | None,
                                                     expected: str) -> None:
    facts = _facts(_client(tpot_s, in_flight=2.0 + waiting, decoding=2.0), _llama_metrics(2.0, waiting),
                   alone_s=alone_s, slots=8 if not waiting else 2)
    assert decide(facts).bottleneck == expected


def test_a_seat_limit_is_read_with_every_slot_busy() -> None:
    result = decide(_facts(_client(0.012, in_flight=8.0, decoding=2.0), _llama_metrics(2.0, 6.0), alone_s=0.010,
                           slots=2))
    assert result.bottleneck == "batching" and {"server_queue", "server_queue_depth"} <= set(result.deciding)
    busy = next(e for e in result.evidence if e.name == "server_slots_busy")
    assert busy.passed and "2 of its 2 slots busy" in busy.summary
    assert "llama-server -np 4" in result.lever and "every one of its 2 slots was busy" in result.summary


def test_refusals_and_context_exhaustion_by_share() -> None:
    client = _client(0.012, in_flight=4.0, decoding=4.0)
    refused = FailureCounts(num_requests=100, by_kind={"refused_busy": 30})
    full = FailureCounts(num_requests=100, by_kind={"context_full": 30, "dropped": 2})
    assert decide(_facts(client, None, 0.010, refused)).bottleneck == "batching"
    assert decide(_facts(client, _llama_metrics(4.0, 0.0), 0.010, full)).bottleneck == "cache"
    # A stray failure (under 5% of the requests) is no limit.
    stray = FailureCounts(num_requests=100, by_kind={"context_full": 2})
    assert decide(_facts(client, None, 0.010, stray)).bottleneck == "none"


def _capacity(serial_gain: float, max_streams: float | None) -> Capacity:
    return Capacity(concurrency=1, output_tokens_per_s=14.0, goodput=None, method="plateau", reason="", limit=None,
                    limit_evidence="", knee=NO_KNEE, points=[], stopped="", serial_gain=serial_gain,
                    max_decoding_streams=max_streams)


def test_flat_throughput_is_serial_only_if_no_two_streams_ever_decoded_at_once() -> None:
    assert is_serial(_capacity(1.05, 1.0))  # transformers serve without continuous batching
    assert is_serial(_capacity(1.05, None))  # no stream timings: the throughput alone
    # transformers serve --continuous-batching with a KV pool of two requests: flat, but two at once.
    assert not is_serial(_capacity(1.05, 2.1))
    assert not is_serial(_capacity(1.8, 1.0))
