"""Baselines the engine's levers are measured against, on the same weights."""

from engine.baselines.static import NaiveEngine, StaticBatchEngine

__all__ = ["NaiveEngine", "StaticBatchEngine"]
