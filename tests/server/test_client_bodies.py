"""The exact request bodies GuideLLM 0.8.1, AIPerf 0.13.0 and ``vllm bench serve`` send, replayed against ``servescope serve``.

Each fixture in ``client_bodies/`` names the client code that builds it. Streamed answers are read
the way each client reads them (the rules below restate their parsers, named per function), so a
body the client would count as an error or as empty output fails here, without the client installed.
``tox -e peers`` runs the clients themselves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.serve_process import ServeProcess

BODIES = sorted((Path(__file__).parent / "client_bodies").glob("*.json"))


@dataclass
class Parsed:
    """What a client takes from one response: its text, the last usage seen, how many chunks carried content."""

    text: str = ""
    usage: dict[str, Any] | None = None
    num_content_chunks: int = 0
    num_chunks: int = 0
    usages: list[dict[str, Any]] = field(default_factory=list)


def guidellm_stream(lines: list[str], chat: bool) -> Parsed:
    """GuideLLM's ``add_streaming_line``/``extract_line_data``: ``data:`` lines only, ``[DONE]`` ends,
    a payload with ``error`` fails the request, text from ``choices[0]``, the latest ``usage`` wins."""
    parsed = Parsed()
    for raw in lines:
        line = raw.strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            break
        data = json.loads(payload)
        parsed.num_chunks += 1
        assert not data.get("error"), f"GuideLLM marks this request errored: {data}"
        choices = data.get("choices") or []
        choice = choices[0] if choices else {}
        text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        if text:
            parsed.text += text
            parsed.num_content_chunks += 1
        if data.get("usage"):
            parsed.usage = data["usage"]
            parsed.usages.append(data["usage"])
    return parsed


def aiperf_stream(body: bytes, chat: bool) -> Parsed:
    """AIPerf's ``SSEMessage.parse``/``get_json`` and the endpoint's ``extract_*_response_data``: messages
    split on blank lines, ``data`` fields joined, ``[DONE]`` skipped, ``object`` must match the endpoint,
    an ``error`` event fails the request; a record needs at least one content response to be valid."""
    parsed = Parsed()
    expected_object = "chat.completion.chunk" if chat else "text_completion"
    for message in body.decode("utf-8", "replace").replace("\r\n", "\n").split("\n\n"):
        fields = [line.split(":", 1) for line in message.split("\n") if line and not line.startswith(":")]
        assert all(name.strip() != "event" or value.strip() != "error" for name, value in fields)
        data = "\n".join(value.strip() for name, value in fields if name.strip() == "data")
        if data in ("", "[DONE]"):
            continue
        obj = json.loads(data)
        parsed.num_chunks += 1
        assert obj.get("object") == expected_object, f"AIPerf drops an unrecognised object: {obj}"
        choices = obj.get("choices") or []
        if choices:
            content = (choices[0].get("delta") or {}).get("content") if chat else choices[0].get("text")
            if content:
                parsed.text += content
                parsed.num_content_chunks += 1
        if obj.get("usage"):
            parsed.usage = obj["usage"]
            parsed.usages.append(obj["usage"])
    return parsed


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    # NOTE: skip_special_tokens is left at its default (true), as the clients send it; the dummy
    # model's random weights pick reserved special tokens often, so some text deltas are empty.
    process = ServeProcess()
    yield process
    process.stop()


def test_every_client_body_has_a_fixture() -> None:
    clients = {json.loads(p.read_text())["client"] for p in BODIES}
    assert clients == {"guidellm", "aiperf", "vllm-bench-serve"}


@pytest.mark.parametrize("path", BODIES, ids=[p.stem for p in BODIES])
def test_client_body_is_served_and_parses_as_the_client_parses_it(server: ServeProcess, path: Path) -> None:
    fixture = json.loads(path.read_text())
    body, endpoint = fixture["body"], fixture["path"]
    chat = endpoint == "/v1/chat/completions"
    wanted = body.get("max_completion_tokens", body.get("max_tokens"))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        if not body.get("stream"):
            response = client.post(endpoint, json=body)
            assert response.status_code == 200, response.text
            answer = response.json()
            assert answer["object"] == ("chat.completion" if chat else "text_completion")
            assert answer["usage"]["completion_tokens"] == wanted
            choice = answer["choices"][0]
            assert isinstance(choice["message"]["content"] if chat else choice["text"], str)
            return
        with client.stream("POST", endpoint, json=body) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = response.read()
    lines = raw.decode().splitlines()
    for parsed in (guidellm_stream(lines, chat), aiperf_stream(raw, chat)):
        assert parsed.usage is not None and parsed.usage["completion_tokens"] == wanted
        assert parsed.usage["total_tokens"] == parsed.usage["prompt_tokens"] + wanted
        if body["stream_options"].get("continuous_usage_stats"):
            counts = [u["completion_tokens"] for u in parsed.usages]
            assert len(counts) == parsed.num_chunks, "usage on every chunk"
            assert counts == sorted(counts)
            assert not chat or counts[0] == 0, "the role chunk comes before any token"
        else:
            assert len(parsed.usages) == 1, "usage only on the final chunk"
    # the non-streamed text of the same greedy request is what the client assembled from the deltas
    again = httpx.post(f"{server.url}{endpoint}", json={**body, "stream": False, "stream_options": None,
                                                        "temperature": 0.0}, timeout=60).json()
    greedy_stream = guidellm_stream(_stream_lines(server, endpoint, {**body, "temperature": 0.0}), chat)
    assert greedy_stream.text == (again["choices"][0]["message"]["content"] if chat else again["choices"][0]["text"])


def _stream_lines(server: ServeProcess, endpoint: str, body: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", f"{server.url}{endpoint}", json=body, timeout=60) as response:
        assert response.status_code == 200
        return list(response.iter_lines())
