"""The request plan: the seeded list of requests a run's workers draw from, saved as ``workload.jsonl``.

The orchestrator builds it once with the tokenizer (so Locust's processes never load one) and
writes it into the run directory, where it also records exactly what was asked.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtests.config import LoadConfig
from loadtests.workloads.catalog import ChatSessions, TokenizerLike, make_workload

# Room left for the chat template's tokens around a prompt sent to /v1/chat/completions.
CHAT_TEMPLATE_MARGIN = 64
# Workloads whose requests are independent draws of two lengths: a controlled point deals them from a
# stratified deck (loadtests.workloads.stratified); the others' order or grouping is their point.
STRATIFIABLE = ("sharegpt-synth", "mixed", "long-context", "fixed")


@dataclass(slots=True, frozen=True)
class PlannedRequest:
    """One request of the plan: prompt text, how many tokens it was cut to, how many to generate."""

    index: int
    prompt: str
    num_prompt_tokens: int
    max_tokens: int
    group: str = ""
    arrival_s: float | None = None  # a trace's: when to send it, seconds after the run starts
    # NOTE: set for traces only: /v1/completions then gets the token ids, so lengths are exact on any tokenizer.
    prompt_token_ids: list[int] | None = None
    turn: int | None = None  # chat sessions: this user message's turn in the session ``group``


def build_plan(config: LoadConfig, tokenizer: TokenizerLike, max_model_len: int | None) -> list[PlannedRequest]:
    """``config.plan_size()`` requests of ``config.workload``, seeded by ``config.seed``.

    A prompt too long for ``max_model_len`` (what the server reports) next to its own output is
    cut at the end to fit, less a margin for the chat template when ``config.api`` is chat.
    """
    overrides: dict[str, object] = {}
    if config.max_tokens is not None:
        overrides["max_output_tokens"] = max(1, round(config.max_tokens * config.token_scale))
    if config.token_scale != 1.0:
        overrides["token_scale"] = config.token_scale
    if config.is_trace:
        overrides.update(time_scale=config.time_scale, max_requests=config.max_requests)
    if config.workload == "chat-sessions":
        overrides["num_turns"] = config.turns
    if config.stop_rule is not None and config.workload in STRATIFIABLE:
        overrides["stratified"] = True  # NOTE: a point that ends when its throughput is known sees the whole mix
    workload = make_workload(config.workload, **overrides)
    if isinstance(workload, ChatSessions) and max_model_len is not None:
        longest = workload.max_session_tokens() + CHAT_TEMPLATE_MARGIN * workload.num_turns
        if longest > max_model_len:
            raise ValueError(f"a chat session of {workload.num_turns} turns may reach {longest} tokens of history, "
                             f"past the server's max_model_len {max_model_len}; lower --turns or --max-tokens")
    items = workload.items(config.plan_size(), tokenizer, config.seed)
    margin = CHAT_TEMPLATE_MARGIN if config.api == "chat" else 0
    plan = []
    for index, item in enumerate(items):
        ids, prompt = item.prompt_token_ids, item.prompt
        if max_model_len is not None and item.turn is None:
            room = max_model_len - margin - item.max_tokens
            if room < 1:
                raise ValueError(f"max_tokens {item.max_tokens} leaves no room for a prompt in the server's "
                                 f"max_model_len {max_model_len}; lower --max-tokens")
            if len(ids) > room:
                ids = ids[:room]
                prompt = tokenizer.decode(ids)
        plan.append(PlannedRequest(index, prompt, len(ids), item.max_tokens, item.group, item.arrival_s,
                                   list(ids) if config.is_trace else None, item.turn))
    return plan


def write_plan(path: str | os.PathLike[str], plan: list[PlannedRequest]) -> Path:
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        for item in plan:
            f.write(json.dumps(asdict(item), separators=(",", ":")) + "\n")
    return path


def read_plan(path: str | os.PathLike[str]) -> list[PlannedRequest]:
    with open(path, encoding="utf-8") as f:
        return parse_plan(f.read(), str(path))


def parse_plan(text: str, source: str) -> list[PlannedRequest]:
    """The plan in ``text`` (``workload.jsonl``'s lines); ``source`` names where it came from in errors."""
    plan = [PlannedRequest(**json.loads(line)) for line in text.splitlines() if line.strip()]
    if not plan:
        raise ValueError(f"{source} holds no requests")
    return plan
