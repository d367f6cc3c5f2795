"""Embedded KVFlow engine in plain torch: ``Engine(EngineConfig(...))`` implements
``backends.base.ServingEngine`` (in-process for the runtime, behind ``backends.server``)."""

from backends.local.config import EngineConfig
from backends.local.engine import Engine

__all__ = ["Engine", "EngineConfig"]
