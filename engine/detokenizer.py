"""Incremental detokenization with stop strings, safe for multi-byte characters split across tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer


_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas and watches for stop strings.

    NOTE: while stop strings are set, the last ``max(len(stop)) - 1`` characters are held back,
    so a streamed delta never contains the start of a stop string that later completes.
    """

    def __init__(self, tokenizer: Tokenizer, stop: list[str], include_stop_str_in_output: bool,
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stop = stop
        self._include_stop = include_stop_str_in_output
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self._num_released = 0
        self._stopped = False

    def add_token(self, token_id: int, can_stop: bool = True) -> str | None:
        """Append one token; returns the stop string it completed, if any (none while not ``can_stop``)."""
        self._token_ids.append(token_id)
        prefix = self._decode(self._token_ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._token_ids[self._prefix_offset:])
        if len(full) <= len(prefix) or full.endswith(_INCOMPLETE):
            return None
        delta = full[len(prefix):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        search_from = max(0, len(self.text) - self._hold)
        self.text += delta
        if not can_stop:
            return None
        for stop in self._stop:
            index = self.text.find(stop, search_from)
            if index != -1:
                self.text = self.text[: index + len(stop) if self._include_stop else index]
                self._stopped = True
                return stop
        return None

    def flush(self) -> None:
        """At finish: add the text of tokens still held back as an incomplete character."""
        if self._stopped or self._read_offset == len(self._token_ids):
            return
        prefix = self._decode(self._token_ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._token_ids[self._prefix_offset:])
        self.text += full[len(prefix):]
        self._read_offset = len(self._token_ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out that is safe to release now (all of it once finished)."""
        limit = len(self.text) if finished or not self._stop else max(self._num_released, len(self.text) - self._hold)
        delta = self.text[self._num_released:limit]
        self._num_released = limit
        return delta
