"""Text <-> token ids and chat prompts, backed by the HF ``tokenizers`` library.

Three sources build a :class:`Tokenizer`: GGUF metadata (byte-level BPE vocabularies), an HF
``tokenizer.json``, and a deterministic byte-level vocabulary for dummy models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import tokenizers
from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

KNOWN_ROLES = ("system", "user", "assistant", "tool")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# NOTE: llama.cpp ends generation on any of these ids (end of sequence, of turn, of message).
GGUF_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")

BYTE_LEVEL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# GGUF ``tokenizer.ggml.token_type`` values (llama.cpp's llama_token_type).
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# Llama-3's split: contractions, letters, digits in groups of up to three, punctuation, newlines.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gguf_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for a GGUF ``tokenizer.ggml.pre`` name (llama.cpp's names)."""
    if pre in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # NOTE: SmolLM's own tokenizer.json and llama.cpp's "smollm" rule both split every digit
        # off first, then apply GPT-2's regex. The split matters beyond digits: "a  1" is
        # [a, ĠĠ, 1] here, [a, Ġ, Ġ, 1] without it.
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    raise ValueError(
        f"unsupported GGUF pre-tokenizer {pre!r}; supported: default, gpt2, smollm, llama-bpe"
    )


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the rest map past U+0100."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


class Tokenizer:
    """Encodes and decodes text and renders chat prompts for one model.

    ``eos_token_ids`` lists every id that ends a generation; ``eos_token_id`` is its first. The chat
    template is the model's own Jinja2 template, rendered in a sandbox; without one, ChatML.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        chat_template: str | None = None,
    ) -> None:
        vocab_size = backend.get_vocab_size(with_added_tokens=True)
        for token_id in [*([] if bos_token_id is None else [bos_token_id]), *eos_token_ids]:
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"special token id {token_id} is outside the vocabulary (size {vocab_size})")
        self._backend = backend
        self._bos_token_id = bos_token_id
        self._eos_token_ids = list(dict.fromkeys(eos_token_ids))
        self._chat_template = chat_template if chat_template is not None else CHATML_TEMPLATE
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self._chat_template)
        except TemplateError as error:
            raise ValueError(f"chat template does not parse: {error}") from error

    # ---------------------------------------------------------------- constructors

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF ``tokenizer.*`` metadata (full key names, values already decoded).

        Only byte-level BPE (``tokenizer.ggml.model == "gpt2"``) is supported. Control tokens
        (type 3) become special added tokens, so ``<|im_start|>`` in text encodes as one id.
        """
        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer model {model!r}; only byte-level BPE ('gpt2') is supported")
        tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        merges: list[str] = list(metadata.get("tokenizer.ggml.merges", []))
        token_types: list[int] = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        if len(token_types) != len(tokens):
            raise ValueError(f"GGUF has {len(tokens)} tokens but {len(token_types)} token types")
        vocab = {token: index for index, token in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise ValueError("GGUF vocabulary has duplicate tokens; ids would not round-trip")
        pairs = [tuple(merge.split(" ")) for merge in merges]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("GGUF merges must each be two tokens separated by one space")

        backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        backend.pre_tokenizer = _gguf_pre_tokenizer(str(metadata.get("tokenizer.ggml.pre", "default")))
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([
            AddedToken(token, special=True, normalized=False)
            for token, kind in zip(tokens, token_types, strict=True) if kind == _TOKEN_TYPE_CONTROL
        ])
        backend.add_tokens([
            AddedToken(token, special=False, normalized=False)
            for token, kind in zip(tokens, token_types, strict=True) if kind == _TOKEN_TYPE_USER_DEFINED
        ])

        bos_value = metadata.get("tokenizer.ggml.bos_token_id")
        bos = None if bos_value is None else int(bos_value)
        eos_ids = [int(metadata[key]) for key in GGUF_EOS_KEYS if metadata.get(key) is not None]
        _set_post_processor(
            backend,
            bos_token_id=bos if metadata.get("tokenizer.ggml.add_bos_token", False) else None,
            eos_token_id=eos_ids[0] if eos_ids and metadata.get("tokenizer.ggml.add_eos_token", False) else None,
        )
        template = metadata.get("tokenizer.chat_template")
        return cls(backend, bos_token_id=bos, eos_token_ids=eos_ids,
                   chat_template=str(template) if template is not None else None)

    @classmethod
    def from_file(
        cls,
        path: Path,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        chat_template: str | None = None,
    ) -> Tokenizer:
        """Build from an HF ``tokenizer.json``; its own post-processor decides what special tokens wrap text."""
        if not Path(path).is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        backend = tokenizers.Tokenizer.from_file(str(path))
        return cls(backend, bos_token_id=bos_token_id, eos_token_ids=eos_token_ids, chat_template=chat_template)

    @classmethod
    def byte_level(cls, vocab_size: int) -> Tokenizer:
        """A deterministic tokenizer for dummy models: id ``b`` is byte ``b`` (0-255), then the specials.

        Ids 256-258 are ``<|endoftext|>`` (the eos), ``<|im_start|>`` and ``<|im_end|>``; the rest
        up to ``vocab_size`` are reserved special tokens, so every id a random model emits decodes.
        """
        num_fixed = 256 + len(BYTE_LEVEL_SPECIALS)
        if vocab_size < num_fixed:
            raise ValueError(f"a byte-level tokenizer needs vocab_size >= {num_fixed}, got {vocab_size}")
        vocab = {char: byte for byte, char in byte_to_unicode().items()}
        backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        specials = [*BYTE_LEVEL_SPECIALS, *(f"<|reserved_{i}|>" for i in range(vocab_size - num_fixed))]
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
        assert backend.get_vocab_size(with_added_tokens=True) == vocab_size
        return cls(backend, bos_token_id=None, eos_token_ids=[256])

    # ---------------------------------------------------------------- encoding

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        """Id that begins a sequence, if the model has one."""
        return self._bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        """The primary end-of-sequence id."""
        return self._eos_token_ids[0] if self._eos_token_ids else None

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends a generation."""
        return list(self._eos_token_ids)

    @property
    def chat_template(self) -> str:
        """The Jinja2 source :meth:`apply_chat_template` renders (ChatML when the model has none)."""
        return self._chat_template

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer`` (for batch encoding or saving)."""
        return self._backend

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special tokens written in the text map to their single ids.

        ValueError for text that is not valid Unicode: JSON's and Python's ``\\u`` escapes can
        carry lone UTF-16 surrogates, which the tokenizer backend cannot take.
        """
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the text is not valid Unicode: a lone surrogate {text[exc.start]!r} at "
                             f"character {exc.start}") from exc
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; byte sequences cut mid-character decode to U+FFFD."""
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of one vocabulary entry, or ``None``."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Vocabulary entry of one id, or ``None``."""
        return self._backend.id_to_token(token_id)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write an HF tokenizer directory (``tokenizer.json``, ``tokenizer_config.json``, chat template).

        External clients that count tokens themselves (GuideLLM's ``--processor``, AIPerf's
        ``--tokenizer``) load it with ``AutoTokenizer`` and count exactly as this server does.
        """
        from transformers import PreTrainedTokenizerFast

        def name(token_id: int | None) -> str | None:
            return None if token_id is None else self.id_to_token(token_id)

        hf = PreTrainedTokenizerFast(tokenizer_object=self._backend, bos_token=name(self._bos_token_id),
                                     eos_token=name(self.eos_token_id))
        hf.chat_template = self._chat_template
        directory = Path(directory)
        hf.save_pretrained(directory)
        return directory

    # ---------------------------------------------------------------- chat

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render ``messages`` with the model's chat template into one prompt string."""
        _validate_messages(messages)
        bos = None if self._bos_token_id is None else self.id_to_token(self._bos_token_id)
        eos = None if self.eos_token_id is None else self.id_to_token(self.eos_token_id)
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=bos or "", eos_token=eos or "",
            )
        except TemplateError as error:
            raise ValueError(f"chat template failed to render: {error}") from error


def _validate_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}] must be a dict, got {type(message).__name__}")
        role = message.get("role")
        if role not in KNOWN_ROLES:
            raise ValueError(f"messages[{index}] has unknown role {role!r}; expected one of {KNOWN_ROLES}")
        if "content" not in message:
            raise ValueError(f"messages[{index}] ({role}) has no 'content'")
        if not isinstance(message["content"], str):
            raise ValueError(
                f"messages[{index}] ({role}) content must be a str, got {type(message['content']).__name__}"
            )


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


def _set_post_processor(backend: tokenizers.Tokenizer, bos_token_id: int | None, eos_token_id: int | None) -> None:
    """Wrap single sequences in bos/eos when ``add_special_tokens=True``, as the GGUF flags ask."""
    if bos_token_id is None and eos_token_id is None:
        return
    bos = [] if bos_token_id is None else [(backend.id_to_token(bos_token_id), bos_token_id)]
    eos = [] if eos_token_id is None else [(backend.id_to_token(eos_token_id), eos_token_id)]
    special = [(str(token), token_id) for token, token_id in [*bos, *eos]]
    single = [token for token, _ in special[: len(bos)]] + ["$A"] + [token for token, _ in special[len(bos):]]
    backend.post_processor = processors.TemplateProcessing(single=single, special_tokens=special)
