"""What a server says of its own configuration, asked once before a load point: ``server_info.json``.

llama.cpp's ``llama-server`` answers ``GET /props`` (its slot count, each slot's context, the model
file) and ``GET /slots`` (each slot's context and whether it is busy); other servers answer 404 and
the file records nothing. Each is fetched on a fresh connection that is closed after it.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

SERVER_INFO_NAME = "server_info.json"
TIMEOUT_S = 5.0


@dataclass(slots=True)
class ServerInfo:
    """The raw answers (None where the server has no such endpoint) and the figures read from them."""

    props: dict[str, Any] | None = None
    slots: list[dict[str, Any]] | None = None

    @property
    def num_slots(self) -> int | None:
        total = (self.props or {}).get("total_slots")
        if isinstance(total, int):
            return total
        return len(self.slots) if self.slots else None

    @property
    def slot_context(self) -> int | None:
        """Tokens one slot may hold (llama-server's per-slot ``n_ctx``)."""
        settings = (self.props or {}).get("default_generation_settings") or {}
        n_ctx = settings.get("n_ctx")
        if isinstance(n_ctx, int):
            return n_ctx
        slot_ctx = [s.get("n_ctx") for s in self.slots or [] if isinstance(s.get("n_ctx"), int)]
        return slot_ctx[0] if slot_ctx else None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "num_slots": self.num_slots, "slot_context": self.slot_context}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerInfo:
        return cls(props=data.get("props"), slots=data.get("slots"))


def fetch_server_info(url: str, api_key: str | None = None) -> ServerInfo:
    """``/props`` and ``/slots`` of the server at ``url``; each None when it does not answer them with JSON."""
    props = _get_json(f"{url}/props", api_key)
    slots = _get_json(f"{url}/slots", api_key)
    return ServerInfo(props=props if isinstance(props, dict) else None,
                      slots=slots if isinstance(slots, list) else None)


def _get_json(url: str, api_key: str | None) -> Any:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),  # noqa: S310 - the target's URL
                                    timeout=TIMEOUT_S) as response:
            return json.loads(response.read(1 << 20))
    except (urllib.error.URLError, OSError, ValueError):
        return None
