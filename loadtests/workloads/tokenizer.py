"""The tokenizer a plan's prompts are cut with, without loading any weights."""

from __future__ import annotations

from pathlib import Path

from engine.tokenizer import Tokenizer

DEFAULT_TOKENIZER = "smollm2-135m"


def load_tokenizer(name: str) -> Tokenizer:
    """The tokenizer of model ``name`` (the names ``--model`` takes): a GGUF's, an HF directory's, a dummy's."""
    from engine.weights import DEFAULT_MODEL, DUMMY_PREFIX

    if name == DEFAULT_MODEL:
        from engine.weights.fetch import fetch_smollm2
        from engine.weights.gguf_loader import load_gguf_tokenizer

        return load_gguf_tokenizer(fetch_smollm2())
    if name.startswith(DUMMY_PREFIX):
        from engine.weights.dummy import DUMMY_CONFIGS

        dummy = name.removeprefix(DUMMY_PREFIX)
        if dummy not in DUMMY_CONFIGS:
            raise ValueError(f"unknown dummy model {dummy!r}; known: {sorted(DUMMY_CONFIGS)}")
        return Tokenizer.byte_level(DUMMY_CONFIGS[dummy].vocab_size)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        from engine.weights.gguf_loader import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return Tokenizer.from_file(path / "tokenizer.json")
    raise ValueError(f"no tokenizer for {name!r}: give smollm2-135m, dummy:<name>, a .gguf file or a directory "
                     f"holding tokenizer.json")


def is_known_model(name: str) -> bool:
    """Whether :func:`load_tokenizer` can load ``name`` (a served model's id, say) without guessing."""
    from engine.weights import DEFAULT_MODEL, DUMMY_PREFIX

    path = Path(name).expanduser()
    return (name == DEFAULT_MODEL or name.startswith(DUMMY_PREFIX) or (path.is_file() and path.suffix == ".gguf")
            or (path.is_dir() and (path / "tokenizer.json").is_file()))
