"""The vLLM extensions benchmark clients send (GuideLLM, AIPerf, ``vllm bench serve``), each on the live server.

Logprobs are checked against HF transformers' log-softmax on the same weights; the other options
against what they must do to the tokens (min_tokens, min_p, skip_special_tokens) or the stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import torch

from engine import LLM, SamplingParams
from engine.weights import LoadedModel
from tests.engine.hf_oracle import hf_model_from
from tests.server.conftest import API_KEY, ENGINE_KWARGS, MODEL, LiveServer

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
# NOTE: each test uses its own prompt so no result depends on what another left in the prefix cache.


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.api_url, headers=HEADERS, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def offline(tiny_loaded: LoadedModel) -> LLM:
    return LLM(MODEL, loaded=tiny_loaded, **ENGINE_KWARGS)


def _ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def _events(client: httpx.Client, path: str, body: dict) -> list[dict]:
    """Every SSE data event of a streamed request, ``[DONE]`` last (checked, then dropped)."""
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


# -- stream_options.continuous_usage_stats ---------------------------------------------------------

def test_continuous_usage_puts_running_usage_on_every_chat_chunk(client: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "usage on every chunk"}],
            "max_completion_tokens": 9, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events = _events(client, "/chat/completions", body)
    *chunks, usage_only = events
    assert usage_only["choices"] == [] and usage_only["usage"]["completion_tokens"] == 9
    prompt_tokens = usage_only["usage"]["prompt_tokens"]
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts[0] == 0 and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert counts == sorted(counts) and counts[-1] == 9
    assert all(c["usage"]["total_tokens"] == prompt_tokens + n for c, n in zip(chunks, counts, strict=True))


def test_continuous_usage_on_completion_chunks_and_off_without_include_usage(client: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "count the chunks", "max_tokens": 7, "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    *chunks, usage_only = _events(client, "/completions", body)
    assert [c["usage"]["completion_tokens"] for c in chunks][-1] == 7
    assert all(c["usage"] is not None for c in chunks) and usage_only["usage"]["completion_tokens"] == 7
    # vLLM sends running usage only when include_usage is set too.
    quiet = _events(client, "/completions", {**body, "stream_options": {"continuous_usage_stats": True}})
    assert all(e["usage"] is None for e in quiet)


# -- token limits: max_completion_tokens, min_tokens, ignore_eos ----------------------------------

def test_max_completion_tokens_wins_over_max_tokens(client: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "limits"}], "max_tokens": 3,
            "max_completion_tokens": 6, "ignore_eos": True}
    assert _ok(client.post("/chat/completions", json=body))["usage"]["completion_tokens"] == 6


def test_min_tokens_holds_back_a_stop_token_until_it_is_reached(client: httpx.Client, offline: LLM) -> None:
    prompt = [40, 41, 42, 43]
    first = offline.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))[0].token_ids[0]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0.0, "stop_token_ids": [first],
            "logprobs": 0}
    stopped = _ok(client.post("/completions", json=body))
    assert stopped["usage"]["completion_tokens"] == 1 and stopped["choices"][0]["finish_reason"] == "stop"
    held = _ok(client.post("/completions", json={**body, "min_tokens": 5}))
    tokens = held["choices"][0]["logprobs"]["tokens"]
    assert held["usage"]["completion_tokens"] >= 5
    # the stop token could not be sampled while fewer than 5 tokens were out
    assert offline.tokenizer.decode([first], skip_special_tokens=False) not in tokens[:5]


def test_min_tokens_above_the_default_max_tokens_is_400(client: httpx.Client) -> None:
    response = client.post("/completions", json={"model": MODEL, "prompt": "x", "min_tokens": 17})
    assert response.status_code == 400 and response.json()["error"]["param"] == "min_tokens"


# -- sampling: min_p -------------------------------------------------------------------------------

def test_min_p_of_one_keeps_only_the_most_likely_token(client: httpx.Client) -> None:
    base = {"model": MODEL, "prompt": "min p prompt", "max_tokens": 12, "ignore_eos": True,
            "skip_special_tokens": False}
    greedy = _ok(client.post("/completions", json={**base, "temperature": 0.0}))["choices"][0]["text"]
    sampled = [_ok(client.post("/completions", json={**base, "temperature": 1.5, "seed": seed, "min_p": 1.0}))
               ["choices"][0]["text"] for seed in (1, 2)]
    assert sampled == [greedy, greedy]
    # NOTE: the same seeds without min_p draw other tokens, so min_p did the work above.
    plain = [_ok(client.post("/completions", json={**base, "temperature": 1.5, "seed": seed}))
             ["choices"][0]["text"] for seed in (1, 2)]
    assert any(text != greedy for text in plain)


# -- skip_special_tokens ---------------------------------------------------------------------------

def test_skip_special_tokens_false_keeps_special_token_text(client: httpx.Client, offline: LLM) -> None:
    # NOTE: the dummy vocabulary's reserved ids are special tokens, and its random weights pick them often.
    body = {"model": MODEL, "prompt": [7, 8, 9], "max_tokens": 16, "ignore_eos": True, "temperature": 0.0,
            "logprobs": 0}
    kept = _ok(client.post("/completions", json={**body, "skip_special_tokens": False}))["choices"][0]
    skipped = _ok(client.post("/completions", json=body))["choices"][0]
    ids = offline.generate([[7, 8, 9]], SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids
    special = [i for i in ids if offline.tokenizer.decode([i]) == ""]
    assert special, "the greedy output holds at least one special token"
    assert kept["text"] == "".join(kept["logprobs"]["tokens"])
    assert kept["text"] == offline.tokenizer.decode(ids, skip_special_tokens=False)
    assert skipped["text"] == offline.tokenizer.decode(ids)
    assert len(skipped["text"]) < len(kept["text"])


# -- logprobs ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf(tiny_loaded: LoadedModel):
    return hf_model_from(tiny_loaded.config, tiny_loaded.state_dict)


@torch.inference_mode()
def _hf_logprobs(hf, prompt: list[int], output: list[int]) -> torch.Tensor:
    """``[len(output), V]``: HF's log-softmax at each output position."""
    logits = hf(input_ids=torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1: len(prompt) + len(output) - 1], dim=-1)


def test_completion_logprobs_are_the_models_log_softmax(client: httpx.Client, offline: LLM, hf) -> None:
    prompt = [50, 60, 70, 80, 90]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "ignore_eos": True, "temperature": 1.0, "seed": 5,
            "logprobs": 3, "skip_special_tokens": False}
    choice = _ok(client.post("/completions", json=body))["choices"][0]
    ids = offline.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, seed=5))[0].token_ids
    expected = _hf_logprobs(hf, prompt, ids)
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [offline.tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert logprobs["token_logprobs"] == pytest.approx([float(expected[n, i]) for n, i in enumerate(ids)], abs=1e-3)
    for n, top in enumerate(logprobs["top_logprobs"]):
        values, top_ids = torch.topk(expected[n], 3)
        want = {offline.tokenizer.decode([i], skip_special_tokens=False): v for i, v in
                zip(top_ids.tolist(), values.tolist(), strict=True)}
        assert top.keys() == want.keys()
        assert list(top.values()) == pytest.approx(list(want.values()), abs=1e-3)
    assert logprobs["text_offset"][0] == 0
    assert logprobs["text_offset"][1:] == [logprobs["text_offset"][n] + len(t)
                                           for n, t in enumerate(logprobs["tokens"][:-1])]


def test_streamed_chat_logprobs_match_the_non_streamed_ones(client: httpx.Client, hf, offline: LLM) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "log me"}], "max_completion_tokens": 6,
            "ignore_eos": True, "temperature": 0.0, "logprobs": True, "top_logprobs": 2}
    whole = _ok(client.post("/chat/completions", json=body))["choices"][0]["logprobs"]["content"]
    events = _events(client, "/chat/completions", {**body, "stream": True})
    streamed = [entry for e in events for c in e["choices"] if c.get("logprobs") for entry in c["logprobs"]["content"]]
    # NOTE: the second request hits the prefix cache, so its floats may differ in the last bits.
    assert len(whole) == 6 and [e["token"] for e in streamed] == [e["token"] for e in whole]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in whole], abs=1e-4)
    prompt = offline.tokenizer.encode(offline.tokenizer.apply_chat_template([{"role": "user", "content": "log me"}]),
                                      add_special_tokens=True)
    ids = offline.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    expected = _hf_logprobs(hf, prompt, ids)
    for n, entry in enumerate(whole):
        # greedy: the sampled token is the most likely one, and its logprob is the model's
        assert entry["logprob"] == pytest.approx(float(expected[n].max()), abs=1e-3)
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-6)
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
        assert entry["bytes"] == list(entry["token"].encode("utf-8", "replace"))


def test_chat_logprobs_true_without_top_logprobs_gives_no_alternatives(client: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "just mine"}], "max_tokens": 3,
            "ignore_eos": True, "logprobs": True}
    content = _ok(client.post("/chat/completions", json=body))["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(entry["top_logprobs"] == [] and entry["logprob"] <= 0 for entry in content)


def test_no_logprobs_unless_asked(client: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "none asked"}], "max_tokens": 2}
    assert _ok(client.post("/chat/completions", json=body))["choices"][0]["logprobs"] is None


# -- neutral values that clients send explicitly -------------------------------------------------------

def test_neutral_values_clients_send_are_accepted(client: httpx.Client) -> None:
    # Neutral values clients spell out: logprobs null and repetition_penalty 1 (vllm bench serve), n=1, stop null.
    body = {"model": MODEL, "prompt": "neutral", "temperature": 0.0, "repetition_penalty": 1.0, "max_tokens": 4,
            "logprobs": None, "n": 1, "stop": None, "ignore_eos": True}
    assert _ok(client.post("/completions", json=body))["usage"]["completion_tokens"] == 4
    chat = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "neutral"}]}],
            "max_completion_tokens": 4, "n": 1, "stop": None, "ignore_eos": True, "temperature": 0.0}
    assert _ok(client.post("/chat/completions", json=chat))["usage"]["completion_tokens"] == 4
