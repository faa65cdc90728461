"""The official ``openai`` client against the live server: greedy text equals offline ``LLM``, usage is right."""

from __future__ import annotations

import openai
import pytest

from engine import LLM, SamplingParams
from engine.weights import LoadedModel
from tests.server.conftest import API_KEY, ENGINE_KWARGS, MODEL, LiveServer

GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.api_url, api_key=API_KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def offline(tiny_loaded: LoadedModel) -> LLM:
    return LLM(MODEL, loaded=tiny_loaded, **ENGINE_KWARGS)


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


# NOTE: every test uses its own prompt, shorter than a KV block where it can, so no test's
# result depends on what an earlier test left in the prefix cache.

def test_completion_equals_offline_generate(client: openai.OpenAI, offline: LLM) -> None:
    expected = offline.generate("The quick fox", _greedy(12))[0]
    response = client.completions.create(model=MODEL, prompt="The quick fox", max_tokens=12, **GREEDY)
    assert response.id.startswith("cmpl-")
    assert response.model == MODEL
    assert response.choices[0].text == expected.text
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert response.usage.completion_tokens == 12
    assert response.usage.total_tokens == len(expected.prompt_token_ids) + 12


def test_streamed_completion_equals_offline_generate(client: openai.OpenAI, offline: LLM) -> None:
    expected = offline.generate("Once upon", _greedy(10))[0]
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=10, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    usage_chunk, body = chunks[-1], chunks[:-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (
        len(expected.prompt_token_ids), 10)
    assert "".join(c.choices[0].text for c in body) == expected.text
    assert [c.choices[0].finish_reason for c in body][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in body[:-1])
    assert all(c.usage is None for c in body)


def test_token_id_prompt_equals_offline_generate(client: openai.OpenAI, offline: LLM) -> None:
    prompt = [72, 105, 33, 10]
    expected = offline.generate([prompt], _greedy(8))[0]
    response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, **GREEDY)
    assert response.choices[0].text == expected.text
    assert response.usage is not None and response.usage.prompt_tokens == len(prompt)


def test_chat_equals_offline_chat(client: openai.OpenAI, offline: LLM) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    expected = offline.chat(messages, _greedy(16))[0]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, **GREEDY)  # type: ignore[arg-type]
    assert response.id.startswith("chatcmpl-")
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected.text
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert response.usage.completion_tokens == 16


def test_streamed_chat_equals_offline_chat(client: openai.OpenAI, offline: LLM) -> None:
    messages = [{"role": "user", "content": "Count to three."}]
    expected = offline.chat(messages, _greedy(14))[0]
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=14,  # type: ignore[arg-type]
                                                 stream=True, stream_options={"include_usage": True}, **GREEDY))
    first, *content, final, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == expected.text
    assert all(c.choices[0].finish_reason is None for c in [first, *content])
    assert final.choices[0].finish_reason == "length"
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert usage_chunk.usage.completion_tokens == 14


def test_stop_string_ends_the_completion_before_it(client: openai.OpenAI, offline: LLM) -> None:
    full = offline.generate("Stop me", _greedy(24))[0].text
    stop = full[6:8]
    assert len(stop) == 2, "the dummy model's greedy text is long enough to hold a stop string"
    response = client.completions.create(model=MODEL, prompt="Stop me", max_tokens=24, stop=[stop], **GREEDY)
    assert response.choices[0].text == full[: full.index(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_sampled_completion_with_a_seed_is_reproducible(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "prompt": "Dice", "max_tokens": 8, "temperature": 1.0, "seed": 11,
              "extra_body": {"ignore_eos": True, "top_k": 50}}
    first = client.completions.create(**kwargs)  # type: ignore[call-overload]
    second = client.completions.create(**kwargs)  # type: ignore[call-overload]
    assert first.choices[0].text == second.choices[0].text
    assert first.usage is not None and first.usage.completion_tokens == 8


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_text_content_parts_are_joined(client: openai.OpenAI, offline: LLM) -> None:
    expected = offline.chat([{"role": "user", "content": "Split message"}], _greedy(6))[0]
    response = client.chat.completions.create(
        model=MODEL, max_tokens=6, **GREEDY,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": [{"type": "text", "text": "Split "},
                                               {"type": "text", "text": "message"}]}])
    assert response.choices[0].message.content == expected.text
