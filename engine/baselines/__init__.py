"""Baselines the engine's levers are measured against, on the same weights."""

from engine.baselines.hf_cb import HFContinuousBatchingEngine
from engine.baselines.static import NaiveEngine, StaticBatchEngine

__all__ = ["HFContinuousBatchingEngine", "NaiveEngine", "StaticBatchEngine"]
