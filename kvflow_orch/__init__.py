"""kvflow orchestration: a workflow DSL, the Agent Step Graph and the runtime that sends hints.

    from kvflow_orch import Workflow, START, END, run
"""

from __future__ import annotations

from typing import Any

from .builder import Workflow
from .constants import END, START
from .errors import WorkflowError
from .protocol import KVFlowHint, StepsUpdate

__all__ = [
    "Workflow",
    "START",
    "END",
    "WorkflowError",
    "AgentStepGraph",
    "KVFlowHint",
    "StepsUpdate",
    "run",
    "arun",
    "run_many",
    "arun_many",
    "RunResult",
]

# Imported lazily: the runtime pulls in httpx and (for backend="local") torch.
_LAZY = {
    "AgentStepGraph": ("kvflow_orch.asg", "AgentStepGraph"),
    "run": ("kvflow_orch.runtime", "run"),
    "arun": ("kvflow_orch.runtime", "arun"),
    "run_many": ("kvflow_orch.runtime", "run_many"),
    "arun_many": ("kvflow_orch.runtime", "arun_many"),
    "RunResult": ("kvflow_orch.runtime", "RunResult"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvflow_orch' has no attribute {name!r}")
