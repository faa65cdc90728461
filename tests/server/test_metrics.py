"""``/metrics`` parses with prometheus-client's parser, uses vLLM's names, and moves under load."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import API_KEY, MODEL, LiveServer, next_events

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
            "vllm:generation_tokens")
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds")


def scrape(live: LiveServer) -> dict[str, float]:
    """Every sample of ``/metrics`` by name (``_total``, ``_count``... kept), for this model."""
    response = httpx.get(f"{live.url}/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.labels.get("model_name") == MODEL and "le" not in sample.labels \
                    and "finished_reason" not in sample.labels:
                samples[sample.name] = sample.value
    return samples


def test_metrics_parse_and_use_vllm_names(live_server: LiveServer) -> None:
    response = httpx.get(f"{live_server.url}/metrics", timeout=30)
    families = {family.name: family.type for family in text_string_to_metric_families(response.text)}
    assert all(families.get(name) == "gauge" for name in GAUGES), families
    assert all(families.get(name) == "counter" for name in COUNTERS), families
    assert all(families.get(name) == "histogram" for name in HISTOGRAMS), families
    samples = scrape(live_server)
    assert {f"{name}_total" for name in COUNTERS} <= set(samples)


def test_gauges_and_counters_move_under_load(live_server: LiveServer) -> None:
    live_server.wait_idle()
    before = scrape(live_server)
    assert before["vllm:num_requests_running"] == 0 and before["vllm:kv_cache_usage_perc"] == 0
    body = {"model": MODEL, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=live_server.api_url, headers=HEADERS, timeout=30) as client, \
            client.stream("POST", "/completions", json={**body, "prompt": "load one"}) as one, \
            client.stream("POST", "/completions", json={**body, "prompt": "load two"}) as two:
        lines = [one.iter_lines(), two.iter_lines()]
        for stream_lines in lines:
            next_events(stream_lines, 1)
        busy = scrape(live_server)
        assert busy["vllm:num_requests_running"] == 2
        assert busy["vllm:kv_cache_usage_perc"] > 0
        assert busy["vllm:generation_tokens_total"] >= before["vllm:generation_tokens_total"] + 2
        assert busy["vllm:time_to_first_token_seconds_count"] == before["vllm:time_to_first_token_seconds_count"] + 2
    live_server.wait_idle()
    after = scrape(live_server)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:prompt_tokens_total"] == before["vllm:prompt_tokens_total"] + 2 * len("load one")
    assert after["vllm:inter_token_latency_seconds_count"] > before["vllm:inter_token_latency_seconds_count"]


def test_prefix_cache_counters_count_a_repeated_prompt(live_server: LiveServer) -> None:
    prompt = "a shared system prompt of more than two blocks of sixteen tokens each"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    live_server.wait_idle()
    before = scrape(live_server)
    for _ in range(2):
        response = httpx.post(f"{live_server.api_url}/completions", json=body, headers=HEADERS, timeout=30)
        assert response.status_code == 200
    second_cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    after = scrape(live_server)
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    assert second_cached == 4 * 16  # 69 prompt tokens: four full blocks are reused
    assert hits == second_cached
    assert queries >= 2 * len(prompt)
    assert after["vllm:e2e_request_latency_seconds_count"] == before["vllm:e2e_request_latency_seconds_count"] + 2
