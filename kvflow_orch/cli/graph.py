"""``kvflow graph MODULE:ATTR [--mermaid]``: print a workflow's Agent Step Graph.

``ATTR`` (dotted paths allowed) may be a :class:`Workflow`, an :class:`AgentStepGraph`, a LangGraph
``StateGraph`` or compiled graph, or a zero-argument callable returning one of those. The current
directory is importable, as with ``python -m``. Exit status: 0 printed, 2 bad ``MODULE:ATTR`` or
an object of another type, 1 the workflow is invalid (the WorkflowError is printed).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from ..asg import AgentStepGraph
from ..builder import Workflow
from ..errors import WorkflowError

__all__ = ["add_arguments", "main", "load_graph", "GraphSpecError"]


class GraphSpecError(ValueError):
    """``MODULE:ATTR`` does not name a workflow; the message says what went wrong."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="MODULE:ATTR", help="e.g. workflows.metagpt:workflow")
    parser.add_argument("--mermaid", action="store_true", help="print Mermaid flowchart text instead")


def main(args: argparse.Namespace) -> int:
    try:
        asg = load_graph(args.target)
    except GraphSpecError as exc:
        print(f"kvflow graph: {exc}", file=sys.stderr)
        return 2
    except WorkflowError as exc:
        print(f"kvflow graph: invalid workflow {args.target}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(asg.to_mermaid() if args.mermaid else asg.describe())
    return 0


def load_graph(spec: str) -> AgentStepGraph:
    """Import ``MODULE:ATTR`` and compile what it names into an :class:`AgentStepGraph`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise GraphSpecError(f"expected MODULE:ATTR (e.g. mypkg.flows:workflow), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GraphSpecError(f"cannot import module {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise GraphSpecError(f"module {module_name!r} has no attribute {attr!r}") from None
    graph = _as_graph(obj)
    if graph is None and callable(obj) and not isinstance(obj, type):
        try:
            made = obj()
        except TypeError as exc:
            raise GraphSpecError(f"calling {spec}() with no arguments failed: {exc}") from None
        graph = _as_graph(made)
    if graph is None:
        raise GraphSpecError(
            f"{spec} is a {type(obj).__name__}; expected a Workflow, an AgentStepGraph, a LangGraph "
            f"StateGraph/compiled graph, or a zero-argument callable returning one"
        )
    return graph


def _as_graph(obj: Any) -> AgentStepGraph | None:
    if isinstance(obj, AgentStepGraph):
        return obj
    if isinstance(obj, Workflow):
        return obj.compile()
    if type(obj).__module__.startswith("langgraph."):
        try:
            return AgentStepGraph.from_langgraph(obj)
        except ImportError as exc:
            raise GraphSpecError(f"LangGraph graphs need kvflow_orch.langgraph: {exc}") from None
    return None
