"""Hypothesis-driven bad input against the live server: every fuzzed body gets a 4xx with a message
(or, when it happens to be valid, a well-formed answer), none a 5xx, and the engine keeps serving the
same greedy answers afterwards with every KV block free.

``SERVESCOPE_FUZZ_EXAMPLES`` sets the cases per strategy (``tox -e fuzz``: 1000 or more in all).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.server.app import ServerSettings
from engine.weights import LoadedModel
from tests.server.conftest import MODEL, LiveServer, start_server, stop_server, tiny_engine

EXAMPLES = int(os.environ.get("SERVESCOPE_FUZZ_EXAMPLES", "60"))
MAX_MODEL_LEN = 96  # a valid body can at most ask for this many tokens, so every case stays quick
MAX_BODY_BYTES = 64 * 1024
FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ROUTES = ["/completions", "/chat/completions"]
PROBE = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "ignore_eos": True}

# -- strategies ------------------------------------------------------------------------------------
json_scalars = st.one_of(
    st.none(), st.booleans(), st.text(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308, -1e308, 0.5, "", "16"]),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "top_k", "seed", "stop", "stop_token_ids", "ignore_eos", "stream", "stream_options", "n",
          "logprobs", "logit_bias", "response_format", "tools", "echo", "suffix", "user", "unknown_field"]
messages = st.lists(st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "developer", ""]),
                       st.text(max_size=12)),
     "content": st.one_of(st.text(max_size=30), st.none(), json_values)}), max_size=4)


@st.composite
def mutated_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid-looking body with fields dropped, retyped or pushed out of range."""
    body: dict[str, Any] = {"model": MODEL, "prompt": "hi", "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 4}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        action = draw(st.sampled_from(["drop", "value", "value", "messages", "prompt"]))
        if action == "drop":
            body.pop(name, None)
        elif action == "messages":
            body["messages"] = draw(messages)
        elif action == "prompt":
            body["prompt"] = draw(st.one_of(
                st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=8),
                st.text(min_size=MAX_MODEL_LEN, max_size=3 * MAX_MODEL_LEN),  # past the context
                st.lists(st.text(max_size=5), max_size=3), st.just([]), st.just("")))
        else:
            body[name] = draw(json_values)
    if isinstance(body.get("max_tokens"), int) and not isinstance(body.get("max_tokens"), bool) \
            and 0 < body["max_tokens"] <= MAX_MODEL_LEN:
        body["max_tokens"] = min(body["max_tokens"], 8)
    return body


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    """Bytes that are not a valid body: broken UTF-8, truncated or deeply nested JSON, junk, oversize."""
    valid = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 2}).encode()
    kind = draw(st.sampled_from(["utf8", "truncated", "nested", "junk", "oversized", "not-object", "empty"]))
    if kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]))
        at = valid.index(b"hello") + draw(st.integers(0, 5))
        return valid[:at] + bad + valid[at:]
    if kind == "truncated":
        return valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == "nested":
        depth = draw(st.sampled_from([100, 1000, 5000, 20000, 30000]))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return b'{"model": "%s", "prompt": ' % MODEL.encode() + (opener * depth + "1" + closer * depth).encode() \
            + b"}"
    if kind == "junk":
        return draw(st.binary(min_size=1, max_size=200))
    if kind == "oversized":
        size = draw(st.integers(MAX_BODY_BYTES + 1, 4 * MAX_BODY_BYTES))
        return json.dumps({"model": MODEL, "prompt": "x" * size}).encode()
    if kind == "not-object":
        return json.dumps(draw(st.one_of(json_scalars, st.lists(json_scalars, max_size=3)))).encode()
    return b""


# -- the server --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_server(tiny_loaded: LoadedModel) -> Iterator[LiveServer]:
    live = start_server(tiny_engine(tiny_loaded, max_model_len=MAX_MODEL_LEN),
                        ServerSettings(max_body_bytes=MAX_BODY_BYTES))
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def client(fuzz_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_server.api_url, timeout=60) as client:
        yield client


def check_answer(response: httpx.Response) -> None:
    """A 4xx carries an OpenAI error with a message; a 200 is a well-formed answer; nothing else."""
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"].strip(), response.text
        return
    assert response.status_code == 200, response.text[:500]
    if response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.rstrip().endswith("data: [DONE]"), response.text[-200:]
    else:
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def probe(client: httpx.Client) -> str:
    response = client.post("/completions", json=PROBE)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_fuzzed_bodies_get_4xx_and_the_server_keeps_serving(fuzz_server: LiveServer, client: httpx.Client) -> None:
    before = probe(client)
    sent = {"mutated": 0, "raw": 0}

    @FUZZ_SETTINGS
    @given(route=st.sampled_from(ROUTES), body=mutated_bodies())
    def mutated(route: str, body: dict[str, Any]) -> None:
        sent["mutated"] += 1
        check_answer(client.post(route, json=body))

    @FUZZ_SETTINGS
    @given(route=st.sampled_from(ROUTES), raw=raw_bodies(), chunked=st.booleans())
    def raw(route: str, raw: bytes, chunked: bool) -> None:
        sent["raw"] += 1
        body = iter([raw[i:i + 8192] for i in range(0, len(raw), 8192)]) if chunked else raw
        response = client.post(route, content=body, headers={"content-type": "application/json"})
        assert 400 <= response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
        check_answer(response)

    mutated()
    raw()
    assert sent["mutated"] >= EXAMPLES and sent["raw"] >= EXAMPLES
    assert probe(client) == before
    idle = fuzz_server.wait_idle()
    assert idle.num_kv_blocks_free == idle.num_kv_blocks
