"""kvflow for LangGraph apps: compile a graph into an Agent Step Graph."""

from __future__ import annotations

from ._compile import UndeclaredTargetsWarning, compile_langgraph

__all__ = ["compile_langgraph", "UndeclaredTargetsWarning"]
