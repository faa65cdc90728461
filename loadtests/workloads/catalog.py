"""Seeded, reproducible request workloads shared by Locust runs and `servescope bench`.

Prompts are windows of real English text (``data/corpus.txt``), tokenized with the model's own
tokenizer and cut to exact token lengths, so a prompt of N tokens is N tokens on the server.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import ClassVar, Protocol

from loadtests.workloads.stratified import stratified_deck
from loadtests.workloads.traces import (
    MOONCAKE_BLOCK_TOKENS,
    TRACE_PREFIX,
    TraceRequest,
    read_trace,
    trace_path,
)


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(slots=True)
class WorkItem:
    """One request of a workload: exact prompt tokens, their text, and the output length to ask for."""

    prompt_token_ids: list[int]
    prompt: str
    max_tokens: int
    group: str = ""  # e.g. the system prompt a shared-prefix item belongs to
    arrival_s: float | None = None  # a trace's: when to send it, seconds after the run starts
    turn: int | None = None  # chat sessions: the turn (0, 1, ...) of the session named by ``group``


@cache
def corpus_text() -> str:
    return resources.files("loadtests.workloads").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def text_window(tokenizer: TokenizerLike, corpus_ids: list[int], length: int, rng: random.Random) -> list[int]:
    """``length`` consecutive corpus tokens from a seeded offset, wrapping around the corpus."""
    start = rng.randrange(len(corpus_ids))
    reps = math.ceil((start + length) / len(corpus_ids))
    return (corpus_ids * reps)[start:start + length]


@dataclass(slots=True)
class Workload:
    """Base: subclasses draw prompt and output lengths; ``items`` builds the requests."""

    name: ClassVar[str] = ""
    max_prompt_tokens: int = 1024
    max_output_tokens: int = 256
    token_scale: float = 1.0  # multiplies every drawn prompt and output length (capacity's tokens experiment)
    stratified: bool = False  # lengths dealt from a stratified, balanced deck (loadtests.workloads.stratified), not drawn

    def lengths(self, rng: random.Random) -> tuple[int, int]:
        raise NotImplementedError

    def sized(self, rng: random.Random) -> tuple[int, int]:
        """One draw of :meth:`lengths`, scaled by ``token_scale`` and held to the caps."""
        prompt_len, output_len = self.lengths(rng)
        return (max(1, min(round(prompt_len * self.token_scale), self.max_prompt_tokens)),
                max(1, min(round(output_len * self.token_scale), self.max_output_tokens)))

    def items(self, num_requests: int, tokenizer: TokenizerLike, seed: int = 0) -> list[WorkItem]:
        if num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {num_requests}")
        rng = random.Random(seed)
        corpus_ids = tokenizer.encode(corpus_text())
        deck = stratified_deck(self.sized, rng) if self.stratified else None
        out = []
        for i in range(num_requests):
            prompt_len, output_len = deck[i % len(deck)] if deck is not None else self.sized(rng)
            ids = text_window(tokenizer, corpus_ids, prompt_len, rng)
            out.append(WorkItem(ids, tokenizer.decode(ids), output_len))
        return out


@dataclass(slots=True)
class Fixed(Workload):
    """Every request has the same prompt and output length."""

    name: ClassVar[str] = "fixed"
    prompt_tokens: int = 128
    output_tokens: int = 64

    def lengths(self, rng: random.Random) -> tuple[int, int]:
        return self.prompt_tokens, self.output_tokens


@dataclass(slots=True)
class ShareGPTSynth(Workload):
    """Chat-like lengths: log-normal prompt and output lengths with a heavy right tail.

    NOTE: the medians and spreads are chosen to give means of about 220 prompt and 200 output
    tokens, the order of magnitude usually quoted for ShareGPT conversations; they are not a fit
    we made to the data set. ``scale`` shrinks both for small machines.
    """

    name: ClassVar[str] = "sharegpt-synth"
    prompt_median: float = 130.0
    prompt_sigma: float = 1.0
    output_median: float = 140.0
    output_sigma: float = 0.85
    scale: float = 1.0

    def lengths(self, rng: random.Random) -> tuple[int, int]:
        prompt = rng.lognormvariate(math.log(self.prompt_median * self.scale), self.prompt_sigma)
        output = rng.lognormvariate(math.log(self.output_median * self.scale), self.output_sigma)
        return round(prompt), round(output)


@dataclass(slots=True)
class Mixed(Workload):
    """Uniform prompt and output lengths in ranges: ragged finishes, the case static batching loses."""

    name: ClassVar[str] = "mixed"
    prompt_range: tuple[int, int] = (16, 256)
    output_range: tuple[int, int] = (8, 128)

    def lengths(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(*self.prompt_range), rng.randint(*self.output_range)


@dataclass(slots=True)
class LongContext(Mixed):
    """Long prompts, short answers: prefill- and KV-heavy."""

    name: ClassVar[str] = "long-context"
    prompt_range: tuple[int, int] = (768, 1000)
    output_range: tuple[int, int] = (16, 48)


@dataclass(slots=True)
class SharedPrefix(Workload):
    """K system prompts x M questions: the prefix-cache hit rate is set by the workload."""

    name: ClassVar[str] = "shared-prefix"
    num_prefixes: int = 4
    prefix_tokens: int = 256
    question_range: tuple[int, int] = (16, 64)
    output_range: tuple[int, int] = (16, 64)

    def items(self, num_requests: int, tokenizer: TokenizerLike, seed: int = 0) -> list[WorkItem]:
        if num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {num_requests}")
        rng = random.Random(seed)
        corpus_ids = tokenizer.encode(corpus_text())
        prefixes = [text_window(tokenizer, corpus_ids, self.prefix_tokens, rng) for _ in range(self.num_prefixes)]
        out = []
        for i in range(num_requests):
            group = i % self.num_prefixes
            question = text_window(tokenizer, corpus_ids, rng.randint(*self.question_range), rng)
            ids = prefixes[group] + question
            out.append(WorkItem(ids, tokenizer.decode(ids), rng.randint(*self.output_range), f"prefix-{group}"))
        return out


@dataclass(slots=True)
class Burst(Mixed):
    """Mixed lengths meant to be sent in bursts (the arrival process groups them; see arrival.py)."""

    name: ClassVar[str] = "burst"


@dataclass(slots=True)
class ChatSessions(Workload):
    """Multi-turn chats: each session is ``num_turns`` user messages; every turn sends the whole history.

    The items are the sessions' user messages, turn by turn (``group`` names the session); the
    assistant's replies are whatever the server answered, added to the history as the turns go, so
    each turn's prompt extends the last one: the case prefix caching exists for.
    """

    name: ClassVar[str] = "chat-sessions"
    num_turns: int = 4
    user_range: tuple[int, int] = (16, 64)
    output_range: tuple[int, int] = (16, 48)

    def items(self, num_requests: int, tokenizer: TokenizerLike, seed: int = 0) -> list[WorkItem]:
        if num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {num_requests}")
        if self.num_turns < 1:
            raise ValueError(f"num_turns must be >= 1, got {self.num_turns}")
        rng = random.Random(seed)
        corpus_ids = tokenizer.encode(corpus_text())
        out = []
        for session in range(math.ceil(num_requests / self.num_turns)):
            for turn in range(self.num_turns):
                ids = text_window(tokenizer, corpus_ids, rng.randint(*self.user_range), rng)
                max_tokens = min(rng.randint(*self.output_range), self.max_output_tokens)
                out.append(WorkItem(ids, tokenizer.decode(ids), max_tokens, f"session-{session}", turn=turn))
        return out

    def max_session_tokens(self) -> int:
        """The most tokens a session's last turn can hold: every message and reply at its longest."""
        return self.num_turns * (self.user_range[1] + min(self.output_range[1], self.max_output_tokens))


@dataclass(slots=True)
class Trace(Workload):
    """A recorded trace replayed as it was (``loadtests.workloads.traces``): its arrival times and exact lengths.

    Every request is sent once, at its own time; ``num_requests`` is ignored. Mooncake's hash ids
    become shared prefixes: each id is one 512-token corpus window, the same for every request
    that names it, so the prefix cache sees the trace's reuse.
    """

    name: ClassVar[str] = "trace"
    path: str = ""
    time_scale: float = 1.0
    max_requests: int | None = None

    def requests(self) -> list[TraceRequest]:
        return read_trace(trace_path(self.path), self.time_scale, self.max_requests)

    def items(self, num_requests: int, tokenizer: TokenizerLike, seed: int = 0) -> list[WorkItem]:
        rng = random.Random(seed)
        corpus_ids = tokenizer.encode(corpus_text())
        blocks: dict[int, list[int]] = {}

        def block(hash_id: int) -> list[int]:
            if hash_id not in blocks:
                blocks[hash_id] = text_window(tokenizer, corpus_ids, MOONCAKE_BLOCK_TOKENS,
                                              random.Random(f"servescope-trace-block-{seed}-{hash_id}"))
            return blocks[hash_id]

        out = []
        for request in self.requests():
            ids = [t for h in request.hash_ids for t in block(h)][:request.input_tokens]
            if len(ids) < request.input_tokens:  # no hash ids, or fewer blocks than the length needs
                ids += text_window(tokenizer, corpus_ids, request.input_tokens - len(ids), rng)
            group = f"prefix-{request.hash_ids[0]}" if request.hash_ids else ""
            max_tokens = min(request.output_tokens, self.max_output_tokens)
            out.append(WorkItem(ids, tokenizer.decode(ids), max_tokens, group, request.arrival_s))
        return out


WORKLOADS: Mapping[str, type[Workload]] = MappingProxyType(
    {cls.name: cls for cls in (Fixed, ShareGPTSynth, Mixed, LongContext, SharedPrefix, Burst, ChatSessions)}
)


def is_trace(name: str) -> bool:
    return name.startswith(TRACE_PREFIX)


def check_workload_name(name: str) -> None:
    """ValueError naming the choices for a workload that is neither registered nor ``trace:FILE``."""
    if is_trace(name):
        trace_path(name)
    elif name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}, "
                         f"or trace:FILE (Mooncake JSONL, BurstGPT or Azure CSV)")


def make_workload(name: str, **overrides: object) -> Workload:
    """A workload by name, with field overrides (e.g. ``max_output_tokens=32``); ``trace:FILE`` replays a file."""
    if is_trace(name):
        return Trace(path=name, **overrides)  # type: ignore[arg-type]
    try:
        cls = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}") from None
    return cls(**overrides)  # type: ignore[arg-type]
