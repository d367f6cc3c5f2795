"""``kvflow run MODULE:ATTR --input JSON [--backend URL|local[:MODEL]] [--record trace.jsonl]``

Runs one instance of a kvflow DSL workflow (``ATTR`` as for ``kvflow graph``: a Workflow, its
AgentStepGraph, or a zero-argument callable returning one). Progress per node goes to stderr; the
final state is printed to stdout as JSON. ``--record`` writes one JSON line per LLM call in the
format documented in :mod:`kvflow_orch.protocol.trace` (the simulator replays it).

Exit status: 0 success, 1 the workflow failed (the WorkflowError is printed), 2 bad arguments.
LangGraph graphs are not run here: instrument them with ``kvflow_orch.langgraph.instrument``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import WorkflowError
from .graph import GraphSpecError, load_graph

__all__ = ["add_arguments", "main", "parse_input"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="MODULE:ATTR", help="e.g. workflows.metagpt:workflow")
    parser.add_argument("--input", default="{}", metavar="JSON", help="initial state as a JSON object, or @FILE")
    parser.add_argument(
        "--backend", default="local", help="local, local:MODEL (smollm2-135m, tiny-random, DIR), http://HOST:PORT or smg+http://GATEWAY:PORT"
    )
    parser.add_argument("--record", metavar="FILE",
                        help="write every LLM call as JSON lines (see kvflow_orch.protocol.trace)")
    parser.add_argument("--workflow-id", help="workflow id sent in hints (default: NAME-<random>)")
    parser.add_argument("--namespace", help="namespace sent in hints (default: 'default')")
    parser.add_argument("--max-steps", type=int, default=100, help="node executions before the run is stopped")
    parser.add_argument("--quiet", action="store_true", help="no per-node progress on stderr")


def parse_input(text: str) -> dict[str, Any]:
    """The ``--input`` value: a JSON object, or ``@path`` to a file holding one."""
    source = "--input"
    if text.startswith("@"):
        source = text[1:]
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(f"cannot read --input file {source!r}: {exc.strerror}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{source} must be a JSON object (the initial state), got {type(value).__name__}")
    return value


def _check_runnable(asg: Any, target: str) -> None:
    for node in asg.nodes.values():
        fn = getattr(node, "fn", None)
        owner = getattr(fn, "__self__", None)
        if owner is not None and type(owner).__module__.startswith(("langgraph", "langchain")):
            raise GraphSpecError(
                f"{target} is a LangGraph graph; run it with its own invoke() after "
                f"kvflow_orch.langgraph.instrument(graph) (kvflow run executes kvflow workflows)"
            )


def main(args: argparse.Namespace) -> int:
    from ..runtime import run
    from ..protocol import write_calls
    from ..harness.console import ProgressPrinter
    from .startup import STARTUP_ERRORS

    try:
        inputs = parse_input(args.input)
        asg = load_graph(args.target)
        _check_runnable(asg, args.target)
        record = open(args.record, "w", encoding="utf-8") if args.record else None
    except (GraphSpecError, ValueError, OSError) as exc:
        print(f"kvflow run: {exc}", file=sys.stderr)
        return 2
    except WorkflowError as exc:
        print(f"kvflow run: invalid workflow {args.target}: {exc}", file=sys.stderr)
        return 1
    if not args.quiet and str(args.backend).startswith("local"):
        print(f"kvflow run: loading the embedded engine ({args.backend}); progress per node follows",
              file=sys.stderr, flush=True)
    try:
        result = run(
            asg,
            inputs,
            backend=args.backend,
            workflow_id=args.workflow_id,
            namespace=args.namespace,
            max_steps=args.max_steps,
            on_event=None if args.quiet else ProgressPrinter(sys.stderr),
        )
        if record is not None:
            n = write_calls(result.calls, record)
            print(f"kvflow run: recorded {n} calls to {args.record}", file=sys.stderr)
    except WorkflowError as exc:
        print(f"kvflow run: {exc}", file=sys.stderr)
        return 1
    except STARTUP_ERRORS as exc:  # a backend argument that names nothing, a local model that cannot load
        print(f"kvflow run: {exc}", file=sys.stderr)
        return 2
    finally:
        if record is not None:
            record.close()
    json.dump(result.state, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0
