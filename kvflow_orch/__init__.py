"""kvflow orchestration: a workflow DSL, the Agent Step Graph and the runtime that sends hints.

    from kvflow_orch import Workflow, START, END, run

Every name is loaded on first use (PEP 562), so importing one submodule (e.g. the wire contract
:mod:`kvflow_orch.protocol`, which backends import) loads nothing else of the package.
"""

from __future__ import annotations

import importlib
from typing import Any

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
    "BranchStats",
]

_LAZY = {
    "Workflow": "kvflow_orch.builder",
    "START": "kvflow_orch.constants",
    "END": "kvflow_orch.constants",
    "WorkflowError": "kvflow_orch.errors",
    "AgentStepGraph": "kvflow_orch.asg",
    "KVFlowHint": "kvflow_orch.protocol",
    "StepsUpdate": "kvflow_orch.protocol",
    "run": "kvflow_orch.runtime",
    "arun": "kvflow_orch.runtime",
    "run_many": "kvflow_orch.runtime",
    "arun_many": "kvflow_orch.runtime",
    "RunResult": "kvflow_orch.runtime",
    "BranchStats": "kvflow_orch.branch_stats",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvflow_orch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
