"""The SSE timer on streams shaped as OpenAI, vLLM and our server send them."""

from __future__ import annotations

import json

import pytest

from loadtests.client.sse import StreamTimer


def event(payload: object) -> str:
    return f"data: {json.dumps(payload)}"


def chat_chunk(delta: dict[str, object], finish: str | None = None) -> str:
    return event({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def text_chunk(text: str, finish: str | None = None) -> str:
    return event({"id": "cmpl-1", "object": "text_completion",
                  "choices": [{"index": 0, "text": text, "finish_reason": finish}]})


USAGE = event({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3,
                                                       "prompt_tokens_details": {"cached_tokens": 4}}})


def feed(timer: StreamTimer, timed_lines: list[tuple[float, str]]) -> None:
    for t, line in timed_lines:
        timer.feed(line, t)


def test_chat_first_token_skips_the_role_chunk_and_empty_chunks() -> None:
    timer = StreamTimer("chat")
    feed(timer, [
        (1.0, chat_chunk({"role": "assistant", "content": ""})), (1.0, ""),
        (1.5, ": keep-alive comment"), (2.0, chat_chunk({})), (2.5, chat_chunk({"content": None})),
        (3.0, chat_chunk({"content": "Hel"})), (3.2, chat_chunk({"content": "lo"})), (3.3, chat_chunk({"content": "!"})),
        (3.4, chat_chunk({}, finish="length")), (9.0, USAGE), (9.5, "data: [DONE]"),
    ])
    timing = timer.finish()
    assert timing.first_token_time == 3.0
    assert timing.token_times == [3.0, 3.2, 3.3]
    assert timing.end_time == 3.4  # the late usage chunk and [DONE] leave it alone
    assert timing.finish_reason == "length" and timing.is_done and timing.error is None
    assert (timing.num_prompt_tokens, timing.num_completion_tokens, timing.num_cached_tokens) == (7, 3, 4)
    assert timing.request_id == "chatcmpl-1"


def test_completions_count_text_chunks_and_end_at_the_finish() -> None:
    timer = StreamTimer("completions")
    feed(timer, [(1.0, text_chunk("")), (2.0, text_chunk(" Paris")), (2.5, text_chunk(".", finish="stop")),
                 (4.0, USAGE), (4.1, "data: [DONE]")])
    timing = timer.finish()
    assert (timing.first_token_time, timing.end_time) == (2.0, 2.5)
    assert timing.token_times == [2.0, 2.5]  # the last text may ride on the finish chunk
    assert timing.num_output_tokens == 3 and timing.has_usage


def test_without_usage_content_chunks_stand_in_for_tokens() -> None:
    timer = StreamTimer("completions")
    feed(timer, [(1.0, text_chunk("a")), (2.0, text_chunk("b")), (3.0, text_chunk("", finish="length"))])
    timing = timer.finish()
    assert not timing.has_usage and timing.num_output_tokens == 2


def test_an_error_event_mid_stream_fails_the_request() -> None:
    timer = StreamTimer("completions")
    feed(timer, [(1.0, text_chunk("a")), (2.0, event({"error": {"message": "engine died", "type": "server_error"}})),
                 (2.1, "data: [DONE]")])
    timing = timer.finish()
    assert timing.error == "engine died"
    assert timing.end_time == 1.0  # no finish: the last content chunk


def test_a_stream_cut_short_is_an_error() -> None:
    timer = StreamTimer("chat")
    feed(timer, [(1.0, chat_chunk({"role": "assistant", "content": ""})), (2.0, chat_chunk({"content": "x"}))])
    assert timer.finish().error == "the stream ended without a finish_reason"


def test_done_without_a_finish_reason_is_complete_at_the_last_content_chunk() -> None:
    timer = StreamTimer("completions")
    feed(timer, [(1.0, text_chunk("a")), (2.0, text_chunk("b")), (2.5, "data: [DONE]")])
    timing = timer.finish()
    assert timing.error is None and timing.finish_reason is None
    assert (timing.end_time, timing.num_output_tokens) == (2.0, 2)


def test_done_without_any_content_or_finish_is_an_error() -> None:
    timer = StreamTimer("completions")
    feed(timer, [(1.0, "data: [DONE]")])
    assert timer.finish().error == "the stream ended without a finish_reason"


def test_garbage_data_is_reported_not_raised() -> None:
    timer = StreamTimer("completions")
    feed(timer, [(1.0, "data: {not json"), (2.0, text_chunk("a", finish="stop"))])
    timing = timer.finish()
    assert timing.error is not None and "not JSON" in timing.error
    assert timing.end_time == 2.0


def test_unknown_api_is_refused() -> None:
    with pytest.raises(ValueError, match="api must be"):
        StreamTimer("embeddings")
