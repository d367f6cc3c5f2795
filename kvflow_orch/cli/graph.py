"""``kvflow graph MODULE:ATTR [--mermaid] [--stats FILE]``: print a workflow's Agent Step Graph.

``kvflow graph --server URL [--mermaid] [--api-key K]``: print what a running ``kvflow serve``
learned from plain traffic (``GET /kvflow/v1/learned``): its agents and who follows whom, with
probabilities (:mod:`.learned_graph`).

With ``--stats`` (a :class:`~kvflow_orch.BranchStats` file, as ``KVFLOW_BRANCH_STATS`` writes) the
listing adds each router's learned probabilities and the expected steps-to-execution of the initial
state next to the static ones.

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
    parser.add_argument("target", metavar="MODULE:ATTR", nargs="?", help="e.g. workflows.metagpt:workflow")
    parser.add_argument("--server", metavar="URL", default=None,
                        help="instead of MODULE:ATTR: the agents and transitions a kvflow server learned")
    parser.add_argument("--api-key", metavar="K", default=None, help="the server's API key (with --server)")
    parser.add_argument("--mermaid", action="store_true", help="print Mermaid flowchart text instead")
    parser.add_argument("--stats", metavar="FILE", default=None,
                        help="branch statistics file: also print learned probabilities and expected steps")


def main(args: argparse.Namespace) -> int:
    if (args.server is None) == (args.target is None):
        print("kvflow graph: give MODULE:ATTR or --server URL (one of them)", file=sys.stderr)
        return 2
    if args.server is not None:
        if args.stats:
            print("kvflow graph: --stats applies to MODULE:ATTR, not to --server", file=sys.stderr)
            return 2
        from .learned_graph import print_learned

        return print_learned(args.server, api_key=args.api_key, mermaid=args.mermaid)
    try:
        asg = load_graph(args.target)
    except GraphSpecError as exc:
        print(f"kvflow graph: {exc}", file=sys.stderr)
        return 2
    except WorkflowError as exc:
        print(f"kvflow graph: invalid workflow {args.target}: {exc}", file=sys.stderr)
        return 1
    if args.stats and args.mermaid:
        print("kvflow graph: --stats applies to the text listing, not to --mermaid", file=sys.stderr)
        return 2
    stats = None
    if args.stats:
        from ..branch_stats import BranchStats

        try:
            stats = BranchStats.load(args.stats)
        except (OSError, ValueError) as exc:
            print(f"kvflow graph: cannot read --stats {args.stats}: {exc}", file=sys.stderr)
            return 2
    sys.stdout.write(asg.to_mermaid() if args.mermaid else asg.describe())
    if stats is not None:
        sys.stdout.write(describe_learned(asg, stats))
    return 0


def describe_learned(asg: AgentStepGraph, stats: Any) -> str:
    """Learned probabilities per router and initial expected vs static steps."""
    import math

    def fmt(v: float) -> str:
        return "inf" if v == math.inf else f"{v:.2f}".rstrip("0").rstrip(".")

    out = ["", f"learned routing (from {len(stats.routers(asg.name))} observed routers):"]
    for router, probs in asg.routing_probabilities(stats).items():
        seen = stats.decisions(asg.name, router)
        ranked = sorted(probs.items(), key=lambda kv: -kv[1])
        out.append(f"  {router} ({seen:g} decisions): " + ", ".join(f"{t}={p:.3f}" for t, p in ranked))
    static, expected = asg.tracker().steps(), asg.tracker(stats).steps()
    width = max((len(n) for n in static), default=8)
    out += ["", "initial steps-to-execution: static -> expected"]
    out += [f"  {name:<{width}}  {fmt(static[name])} -> {fmt(expected[name])}" for name in static]
    return "\n".join(out) + "\n"


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
            from ..langgraph import compile_langgraph  # langgraph is optional for the CLI
        except ImportError as exc:
            raise GraphSpecError(f"LangGraph graphs need kvflow_orch.langgraph: {exc}") from None
        return compile_langgraph(obj)
    return None
