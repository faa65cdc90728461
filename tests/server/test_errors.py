"""Every bad input gets its status code and an OpenAI-shaped message, and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from engine.server.app import ServerSettings
from engine.weights import LoadedModel
from tests.server.conftest import (
    API_KEY,
    MODEL,
    LiveServer,
    next_events,
    start_server,
    stop_server,
    tiny_engine,
)

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
OK_COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TOO_LONG = "x" * 1100  # the byte-level dummy tokenizer: one token per byte, past max_model_len=1024


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.api_url, headers=HEADERS, timeout=30) as client:
        yield client


def _error(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"max_tokens": -1}, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": "ten"}, "max_tokens", "valid integer"),
        ({"max_tokens": 2.5}, "max_tokens", "valid integer"),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
        ({"temperature": "hot"}, "temperature", "valid number"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"top_k": -2}, "top_k", "greater than or equal to -1"),
        ({"stream": "yes"}, "stream", "valid boolean"),
        ({"n": 2}, "n", "only n=1"),
        ({"logprobs": 21}, "logprobs", "less than or equal to 20"),
        ({"logprobs": -1}, "logprobs", "greater than or equal to 0"),
        ({"min_p": 1.5}, "min_p", "less than or equal to 1"),
        ({"min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
        ({"min_tokens": 3, "max_tokens": 2}, "min_tokens", "at most max_tokens"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens", "valid boolean"),
        ({"stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "stream_options",
         "stream is true"),
        ({"stream": True, "stream_options": {"per_chunk": True}}, "stream_options.per_chunk",
         "Unrecognized request argument"),
        ({"echo": True}, "echo", "not supported"),
        ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream is true"),
        ({"max_tokenz": 5}, "max_tokenz", "Unrecognized request argument"),
        ({"stop": [""]}, None, "non-empty strings"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": []}, "prompt", "empty"),
        ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
        ({"prompt": [1, "a"]}, "prompt", "valid"),
        ({"prompt": [100000]}, "prompt", "token ids must be integers"),
        ({"prompt": TOO_LONG}, "prompt", "maximum context length is 1024"),
        ({"prompt": "twelve bytes", "max_tokens": 1020}, "max_tokens", "maximum context length is 1024"),
        ({"prompt": "a\ud800b"}, "prompt", "lone surrogate"),  # found by tests/server/test_fuzz.py
        ({"prompt": ["\udfff"]}, "prompt", "lone surrogate"),
    ],
)
def test_bad_completion_parameters_are_400(client: httpx.Client, change: dict[str, object], param: str | None,
                                           words: str) -> None:
    # NOTE: json.dumps escapes non-ASCII, so lone surrogates travel as \\u escapes, as JSON allows.
    body = json.dumps({**OK_COMPLETION, **change})
    error = _error(client.post("/completions", content=body, headers={"content-type": "application/json"}), 400)
    assert error["type"] == "invalid_request_error"
    assert words in str(error["message"])
    assert error["param"] == param


def test_lone_surrogates_are_400_in_chat_and_echoed_safely(client: httpx.Client) -> None:
    chat = client.post("/chat/completions", content=json.dumps({**OK_CHAT, "messages": [{"role": "user",
                       "content": "\ud83d"}]}), headers={"content-type": "application/json"})
    assert "lone surrogate" in str(_error(chat, 400)["message"])
    # A field named with a lone surrogate is refused with a 400 (the error renders, escaped), not a 500.
    raw = b'{"model": "dummy:tiny", "prompt": "hi", "\\ud800": 1}'
    echoed = client.post("/completions", content=raw, headers={"content-type": "application/json"})
    _error(echoed, 400)


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "n": 3}, "n", "only n=1"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages", "unknown role"),
        ({"messages": [{"role": "user"}]}, "messages", "content must be a str"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages", "only text content parts"),
        ({"messages": [{"role": "user", "content": TOO_LONG}]}, "messages", "maximum context length"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "not supported"),
        ({"top_logprobs": 2}, "top_logprobs", "needs logprobs set to true"),
        ({"logprobs": True, "top_logprobs": 25}, "top_logprobs", "less than or equal to 20"),
        ({"logprobs": 1}, "logprobs", "valid boolean"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
         "messages", "only text content parts"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                    {"type": "video_url", "video_url": {"url": "x"}}]}]},
         "messages", "messages[0].content[1]"),
        ({"max_completion_tokens": -3}, "max_completion_tokens", "greater than or equal to 1"),
    ],
)
def test_bad_chat_parameters_are_400(client: httpx.Client, change: dict[str, object], param: str,
                                     words: str) -> None:
    error = _error(client.post("/chat/completions", json={**OK_CHAT, **change}), 400)
    assert words in str(error["message"])
    assert error["param"] == param


def test_malformed_json_is_400(client: httpx.Client) -> None:
    response = client.post("/completions", content=b'{"model": ', headers={"Content-Type": "application/json"})
    assert "not valid JSON" in str(_error(response, 400)["message"])


def test_unknown_model_is_404(client: httpx.Client) -> None:
    for path, body in (("/completions", OK_COMPLETION), ("/chat/completions", OK_CHAT)):
        error = _error(client.post(path, json={**body, "model": "gpt-17"}), 404)
        assert error["code"] == "model_not_found" and "gpt-17" in str(error["message"])


def test_unknown_route_is_404_in_openai_shape(client: httpx.Client) -> None:
    _error(client.get("/embeddings"), 404)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                                     {"Authorization": f"Basic {API_KEY}"}])
def test_missing_or_wrong_api_key_is_401(live_server: LiveServer, headers: dict[str, str]) -> None:
    for method, path, body in (("POST", "/v1/completions", OK_COMPLETION), ("GET", "/v1/models", None)):
        response = httpx.request(method, f"{live_server.url}{path}", json=body, headers=headers, timeout=30)
        assert _error(response, 401)["code"] == "invalid_api_key"


def test_health_and_metrics_need_no_key(live_server: LiveServer) -> None:
    assert httpx.get(f"{live_server.url}/health", timeout=30).json() == {"status": "ok"}
    assert httpx.get(f"{live_server.url}/metrics", timeout=30).status_code == 200


def test_server_still_serves_after_bad_requests(client: httpx.Client, live_server: LiveServer) -> None:
    for _ in range(3):
        client.post("/completions", json={**OK_COMPLETION, "prompt": [100000]})
        client.post("/completions", json={**OK_COMPLETION, "temperature": 9})
    completion = client.post("/completions", json={**OK_COMPLETION, "ignore_eos": True})
    assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] == 2
    chat = client.post("/chat/completions", json={**OK_CHAT, "ignore_eos": True})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant"
    live_server.wait_idle()


@pytest.fixture(scope="module")
def one_slot_server(tiny_loaded: LoadedModel) -> Iterator[LiveServer]:
    """One running sequence at a time and room for one waiting request: the third in line is refused.

    Each step burns 10 ms of host time, so the first request's 1000 tokens outlast the test on any machine.
    """
    live = start_server(tiny_engine(tiny_loaded, max_num_seqs=1, host_overhead_ms=10), ServerSettings(max_waiting=1))
    yield live
    stop_server(live)


def test_full_waiting_queue_is_429_with_retry_after(one_slot_server: LiveServer) -> None:
    long_body = {"model": MODEL, "prompt": "first", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=one_slot_server.api_url, timeout=30) as client:
        with client.stream("POST", "/completions", json=long_body) as running:
            running_lines = running.iter_lines()
            next_events(running_lines, 1)
            # Headers arrive once the engine has taken the request: it now waits behind the first.
            with client.stream("POST", "/completions", json={**long_body, "prompt": "second"}) as waiting:
                assert waiting.status_code == 200
                stats = one_slot_server.stats()
                assert (stats.num_running, stats.num_waiting) == (1, 1)
                refused = client.post("/completions", json={**long_body, "prompt": "third", "stream": False})
                error = _error(refused, 429)
                assert int(refused.headers["Retry-After"]) >= 1
                assert "waiting" in str(error["message"])
        one_slot_server.wait_idle()
        after = client.post("/completions", json={"model": MODEL, "prompt": "fourth", "max_tokens": 2})
        assert after.status_code == 200
