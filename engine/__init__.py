"""servescope's bundled engine: continuous batching over a paged KV cache on a plain-PyTorch Llama.

The names below are imported on first use (PEP 562), so a command line that only needs ``engine.flags`` or
``engine.config`` to parse its arguments does not load the whole engine first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.llm_engine import LLMEngine
    from engine.observer import EngineObserver, RequestEvent, RequestEventKind, StepStats
    from engine.outputs import EngineStats, RequestOutput
    from engine.sampling_params import SamplingParams

# each exported name, and the module it lives in
_HOMES = {
    "EngineConfig": "engine.config", "LLM": "engine.llm", "LLMEngine": "engine.llm_engine",
    "EngineObserver": "engine.observer", "RequestEvent": "engine.observer", "RequestEventKind": "engine.observer",
    "StepStats": "engine.observer", "EngineStats": "engine.outputs", "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}

__all__ = [
    "LLM", "EngineConfig", "EngineObserver", "EngineStats", "LLMEngine", "RequestEvent", "RequestEventKind",
    "RequestOutput", "SamplingParams", "StepStats",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
