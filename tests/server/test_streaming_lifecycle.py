"""Concurrent streams share engine steps; a client that goes away gets its request aborted and blocks freed."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import openai

from tests.server.conftest import API_KEY, MODEL, LiveServer, next_events

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
# Long enough that the request is still running when the client hangs up (~1000 engine steps).
LONG_MAX_TOKENS = 1000


def test_concurrent_streams_are_batched(live_server: LiveServer) -> None:
    live_server.wait_idle()
    num_steps_before = len(live_server.recorder.batch_sizes)

    async def one(client: openai.AsyncOpenAI, index: int) -> tuple[str, int]:
        stream = await client.completions.create(
            model=MODEL, prompt=f"client {index}", max_tokens=48, temperature=0.0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        text, completion_tokens = "", 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage is not None:
                completion_tokens = chunk.usage.completion_tokens
        return text, completion_tokens

    async def all_clients() -> list[tuple[str, int]]:
        async with openai.AsyncOpenAI(base_url=live_server.api_url, api_key=API_KEY, max_retries=0,
                                      timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(6)))

    results = asyncio.run(all_clients())
    assert [tokens for _, tokens in results] == [48] * 6
    batch_sizes = live_server.recorder.batch_sizes[num_steps_before:]
    assert max(batch_sizes) > 1, f"the six streams never shared a step: {batch_sizes}"
    live_server.wait_idle()


def _long_stream_body(prompt: str) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": LONG_MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "stream": True}


def test_disconnect_mid_stream_aborts_and_frees_blocks(live_server: LiveServer) -> None:
    live_server.wait_idle()
    with httpx.Client(base_url=live_server.url, headers=HEADERS, timeout=30) as client, \
            client.stream("POST", "/v1/completions", json=_long_stream_body("hang up")) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        events = next_events(lines, 2)
        request_id = events[0]["id"]
        busy = live_server.stats()
        assert busy.num_running == 1 and busy.num_kv_blocks_used > 0
        assert request_id not in live_server.recorder.finish_reasons
    idle = live_server.wait_idle()
    assert idle.num_kv_blocks_free == idle.num_kv_blocks
    assert live_server.recorder.finish_reasons[request_id] == "abort"


def test_disconnect_while_waiting_for_a_full_response_aborts(live_server: LiveServer) -> None:
    live_server.wait_idle()
    aborted_before = sum(r == "abort" for r in live_server.recorder.finish_reasons.values())
    body = json.dumps({**_long_stream_body("impatient"), "stream": False}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    # A raw socket, closed as soon as the engine runs the request: the client gives up mid-generation.
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as sock:
        sock.sendall(head + body)
        live_server.wait_until(lambda stats: stats.num_running == 1)
    live_server.wait_idle()
    aborted_after = sum(r == "abort" for r in live_server.recorder.finish_reasons.values())
    assert aborted_after == aborted_before + 1


def test_server_keeps_serving_after_disconnects(live_server: LiveServer) -> None:
    response = httpx.post(f"{live_server.api_url}/completions", headers=HEADERS, timeout=30,
                          json={"model": MODEL, "prompt": "still here", "max_tokens": 3, "ignore_eos": True})
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3
