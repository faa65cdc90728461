"""servescope's bundled engine: continuous batching over a paged KV cache on a plain-PyTorch Llama."""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.observer import EngineObserver, RequestEvent, RequestEventKind, StepStats
from engine.outputs import EngineStats, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = [
    "LLM", "EngineConfig", "EngineObserver", "EngineStats", "LLMEngine", "RequestEvent", "RequestEventKind",
    "RequestOutput", "SamplingParams", "StepStats",
]
