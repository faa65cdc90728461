"""Tokenizer: byte-level dummy vocabulary, GGUF vocabularies, chat templates; HF transformers as oracle."""

from __future__ import annotations

import random
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from engine.tokenizer import CHATML_TEMPLATE, Tokenizer

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "42."},
    {"role": "user", "content": "Thanks! 🎉"},
]


# ---------------------------------------------------------------- byte-level (dummy models)


@pytest.mark.parametrize("text", ["", "hello world", "  two  spaces\n\ttab", "héllo 日本語 🎉", "x = [1, 2]\n"])
def test_byte_level_roundtrip(text: str) -> None:
    tokenizer = Tokenizer.byte_level(512)
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_text_with_a_lone_surrogate_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="lone surrogate '\\\\ud800' at character 1"):
        Tokenizer.byte_level(512).encode("a\ud800b")


def test_byte_level_specials_are_single_ids() -> None:
    tokenizer = Tokenizer.byte_level(300)
    assert tokenizer.vocab_size == 300
    assert tokenizer.encode("<|endoftext|><|im_start|>a<|im_end|>") == [256, 257, 97, 258]
    assert tokenizer.eos_token_id == 256
    assert tokenizer.eos_token_ids == [256]
    assert tokenizer.bos_token_id is None
    # every id a random model can emit decodes; reserved and special ids vanish when skipped
    assert tokenizer.decode([104, 299, 105, 256]) == "hi"
    assert tokenizer.decode([256], skip_special_tokens=False) == "<|endoftext|>"


def test_byte_level_is_deterministic() -> None:
    first, second = Tokenizer.byte_level(4096), Tokenizer.byte_level(4096)
    text = "<|im_start|>user\nsame ids every time<|im_end|>"
    assert first.encode(text) == second.encode(text)
    assert first.backend.to_str() == second.backend.to_str()


def test_saved_hf_tokenizer_counts_and_renders_as_ours(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    ours = Tokenizer.byte_level(512)
    theirs = AutoTokenizer.from_pretrained(ours.save_pretrained(tmp_path / "tok"))
    text = "<|im_start|>user\nhéllo 🎉 and more<|im_end|>"
    assert theirs.encode(text, add_special_tokens=False) == ours.encode(text)
    assert theirs.eos_token_id == ours.eos_token_id
    assert theirs.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == \
        ours.apply_chat_template(CONVERSATION)


def test_byte_level_rejects_small_vocab() -> None:
    with pytest.raises(ValueError, match="vocab_size >= 259"):
        Tokenizer.byte_level(258)


# ---------------------------------------------------------------- chat templates


def test_chatml_fallback_renders() -> None:
    tokenizer = Tokenizer.byte_level(512)
    assert tokenizer.chat_template == CHATML_TEMPLATE
    prompt = tokenizer.apply_chat_template(CONVERSATION[:2])
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert not tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=False).endswith("assistant\n")
    assert tokenizer.encode(prompt)[0] == 257  # <|im_start|> is one id


def test_model_template_uses_special_tokens_and_can_raise() -> None:
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be the user') }}{% endif %}"
        "{{ eos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | tojson }}{% endfor %}"
    )
    base = Tokenizer.byte_level(512)
    tokenizer = Tokenizer(base.backend, bos_token_id=None, eos_token_ids=[258], chat_template=template)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "é"}]) == '<|im_end|>[user]"é"'
    with pytest.raises(ValueError, match="first message must be the user"):
        tokenizer.apply_chat_template(CONVERSATION)


def test_broken_template_raises_at_construction() -> None:
    with pytest.raises(ValueError, match="chat template does not parse"):
        Tokenizer(Tokenizer.byte_level(512).backend, bos_token_id=None, eos_token_ids=[256],
                  chat_template="{% for m in messages %}")


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (["hello"], r"messages\[0\] must be a dict"),
        ([{"role": "wizard", "content": "hi"}], "unknown role 'wizard'"),
        ([{"content": "hi"}], "unknown role None"),
        ([{"role": "user"}], "has no 'content'"),
        ([{"role": "user", "content": "ok"}, {"role": "user", "content": ["a", "b"]}],
         r"messages\[1\] \(user\) content must be a str, got list"),
        ([{"role": "user", "content": None}], "must be a str, got NoneType"),
    ],
)
def test_bad_messages_raise(messages: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Tokenizer.byte_level(512).apply_chat_template(messages)  # type: ignore[arg-type]


# ---------------------------------------------------------------- GGUF metadata (synthetic)


def _tiny_gguf_metadata(**overrides: object) -> dict[str, object]:
    tokens = ["<|endoftext|>", "<|im_start|>", "a", "b", "Ġ", "1", "ab", "ĠĠ", "Ġa"]
    metadata: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3] + [1] * (len(tokens) - 2),
        "tokenizer.ggml.merges": ["a b", "Ġ Ġ", "Ġ a"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 0,
    }
    metadata.update(overrides)
    return metadata


def test_gguf_metadata_tokenizer() -> None:
    tokenizer = Tokenizer.from_gguf_metadata(_tiny_gguf_metadata())
    assert tokenizer.vocab_size == 9
    assert tokenizer.encode("<|im_start|>ab a") == [1, 6, 8]
    # smollm splits digits off first, so the two spaces stay one "ĠĠ" token
    assert tokenizer.encode("a  1") == [2, 7, 5]
    assert tokenizer.decode([1, 6, 8]) == "ab a"
    assert tokenizer.bos_token_id == 1 and tokenizer.eos_token_ids == [0]
    assert tokenizer.encode("ab", add_special_tokens=True) == [6]  # no add_bos_token flag


def test_gguf_metadata_add_bos_flag() -> None:
    tokenizer = Tokenizer.from_gguf_metadata(_tiny_gguf_metadata(**{"tokenizer.ggml.add_bos_token": True}))
    assert tokenizer.encode("ab", add_special_tokens=True) == [1, 6]
    assert tokenizer.encode("ab") == [6]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tokenizer.ggml.model": "llama"}, "only byte-level BPE"),
        ({"tokenizer.ggml.pre": "mystery"}, "unsupported GGUF pre-tokenizer 'mystery'"),
        ({"tokenizer.ggml.token_type": [1]}, "9 tokens but 1 token types"),
        ({"tokenizer.ggml.eos_token_id": 99}, "outside the vocabulary"),
    ],
)
def test_gguf_metadata_errors(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_gguf_metadata(_tiny_gguf_metadata(**overrides))


# ---------------------------------------------------------------- real SmolLM2 vs transformers

# NOTE: none of these has whitespace right before a digit: only there does transformers' GGUF
# tokenizer (plain ByteLevel, no Digits step) differ from SmolLM2's own; see the test below.
ORACLE_TEXTS = [
    "Hello world",
    "The year 2024 had 366 days; pi=3.14159.",
    "I'm sure they'll say it's fine, don't you think?",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nend\r\n",
    "héllo wörld — naïve café, Ångström",
    "日本語のテキストと한국어, Россия",
    "emoji 🎉🚀👍🏽 and a ZWJ 👩‍💻",
    "def square(x):\n    return x**2  # comment\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "URL: https://example.com/a?b=c&d=1#frag",
    "x=1;y=22;z=333 v1.2.3 0xFF",
]


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_gguf: Path) -> Tokenizer:
    from engine.weights.gguf_loader import load_gguf_tokenizer

    return load_gguf_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_gguf: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


def _is_numeric(char: str) -> bool:
    return unicodedata.category(char).startswith("N")


def _digit_isolated_reference(hf_tokenizer: Any, text: str) -> list[int]:
    """SmolLM2's own rule (Digits, then ByteLevel) on transformers' BPE: every numeric character
    becomes its own piece, and transformers encodes each piece."""
    pieces: list[str] = []
    for char in text:
        if _is_numeric(char) or not pieces or _is_numeric(pieces[-1][-1]):
            pieces.append(char)
        else:
            pieces[-1] += char
    return [i for piece in pieces for i in hf_tokenizer.encode(piece, add_special_tokens=False)]


@pytest.mark.real_model
def test_smollm2_matches_transformers(smollm2_tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    for text in ORACLE_TEXTS:
        ids = smollm2_tokenizer.encode(text)
        assert ids == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert smollm2_tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True), text
        assert smollm2_tokenizer.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids), text


@pytest.mark.real_model
def test_smollm2_special_ids(smollm2_tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    assert smollm2_tokenizer.vocab_size == 49152
    assert smollm2_tokenizer.encode("<|im_start|>") == [1]
    assert smollm2_tokenizer.bos_token_id == hf_tokenizer.bos_token_id == 1
    assert smollm2_tokenizer.eos_token_ids == [hf_tokenizer.eos_token_id] == [2]
    # add_bos_token is false in the file: add_special_tokens adds nothing, as in transformers
    assert smollm2_tokenizer.encode("hi", add_special_tokens=True) == hf_tokenizer.encode("hi")


@pytest.mark.real_model
def test_smollm2_splits_digits_like_its_own_tokenizer(smollm2_tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    # SmolLM2's tokenizer.json and llama.cpp's "smollm" rule isolate digits before the GPT-2 split;
    # transformers' GGUF path leaves that step out, which shows only when whitespace precedes a digit.
    tokens = [smollm2_tokenizer.id_to_token(i) for i in smollm2_tokenizer.encode("total:    100")]
    assert tokens == ["total", ":", "ĠĠĠĠ", "1", "0", "0"]
    rng = random.Random(0)
    alphabet = "ab XY12 \n\t\r.,!é日🎉'-_()\u00a0\u2003٣"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16)))
        ids = smollm2_tokenizer.encode(text)
        assert ids == _digit_isolated_reference(hf_tokenizer, text), repr(text)
        if not re.search(r"\s\d", text):
            assert ids == hf_tokenizer.encode(text, add_special_tokens=False), repr(text)


@pytest.mark.real_model
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", [CONVERSATION, CONVERSATION[1:2], CONVERSATION[1:3]])
def test_smollm2_chat_template_matches_transformers(
    smollm2_tokenizer: Tokenizer, hf_tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool,
) -> None:
    ours = smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs
