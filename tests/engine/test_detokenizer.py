"""Incremental detokenization: deltas add up to the full text, stop strings, split characters."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.tokenizer import Tokenizer

BYTES = Tokenizer.byte_level(512)  # id b is byte b


def feed(detok: IncrementalDetokenizer, text: str) -> tuple[list[str], str | None]:
    deltas, hit = [], None
    for token in text.encode():
        hit = detok.add_token(token)
        deltas.append(detok.take_delta(finished=hit is not None))
        if hit is not None:
            break
    return deltas, hit


def test_deltas_concatenate_to_the_text_across_multibyte_characters() -> None:
    detok = IncrementalDetokenizer(BYTES, stop=[], include_stop_str_in_output=False)
    deltas, _ = feed(detok, "naïve café ✓")
    assert "".join(deltas) == detok.text == "naïve café ✓"
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_truncates_and_is_never_streamed() -> None:
    detok = IncrementalDetokenizer(BYTES, stop=["END"], include_stop_str_in_output=False)
    deltas, hit = feed(detok, "abc ENDxyz")
    assert hit == "END"
    assert detok.text == "abc " == "".join(deltas)
    assert not any("E" in d for d in deltas)


def test_stop_string_kept_when_asked() -> None:
    detok = IncrementalDetokenizer(BYTES, stop=["END"], include_stop_str_in_output=True)
    _, hit = feed(detok, "abc ENDxyz")
    assert hit == "END" and detok.text == "abc END"


def test_flush_releases_a_trailing_incomplete_character() -> None:
    detok = IncrementalDetokenizer(BYTES, stop=[], include_stop_str_in_output=False)
    for token in b"ok " + "é".encode()[:1]:
        detok.add_token(token)
    assert detok.text == "ok "
    detok.flush()
    assert detok.text == "ok \ufffd"
    assert detok.take_delta(finished=True) == "ok \ufffd"
