"""The ``kvflow`` command line: a thin dispatcher over one module per subcommand.

This package is the product's composition root: with the harness (:mod:`kvflow_orch.harness`, the
library code it calls) the only code that puts the orchestrator, the workflows and the backends
together. Each subcommand module defines ``add_arguments(parser)`` and ``main(args) -> int`` (and
``PASS_THROUGH_ARGS = True`` to receive unknown flags in ``args.extra_argv``), parses flags and
composes; it is imported only when that subcommand runs, so ``kvflow graph`` never imports torch
and ``kvflow serve`` never imports LangGraph. Nothing imports these modules but to run a command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "COMMANDS"]

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "graph": ("kvflow_orch.cli.graph", "print a workflow's Agent Step Graph (or Mermaid text)"),
    "run": ("kvflow_orch.cli.run", "run a workflow MODULE:ATTR against a backend"),
    "demo": ("kvflow_orch.cli.demo", "run the MetaGPT-style workflow on the embedded engine"),
    "serve": ("kvflow_orch.cli.serve", "start a kvflow server (embedded engine, SGLang or vLLM)"),
    "cluster": ("kvflow_orch.cli.cluster", "start N local workers behind SGLang's model gateway (smg)"),
    "export-model": ("kvflow_orch.cli.export_model", "write a built-in model as a Hugging Face directory"),
    "bench": ("kvflow_orch.cli.bench", "simulate or replay workflows on a hardware profile"),
}


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="kvflow", description="Workflow-aware KV caching for multi-agent LLM apps.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {name: sub.add_parser(name, help=help_, add_help=False) for name, (_, help_) in COMMANDS.items()}
    return parser, subparsers


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, _ = _build_parser()
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in COMMANDS:
        if argv and argv[0] not in {"-h", "--help"}:
            parser.print_usage(sys.stderr)
            print(f"kvflow: unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    module_name, help_ = COMMANDS[name]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(prog=f"kvflow {name}", description=help_)
    module.add_arguments(sub)
    if getattr(module, "PASS_THROUGH_ARGS", False):
        args, extra = sub.parse_known_args(rest)
        args.extra_argv = list(extra)
    else:
        args = sub.parse_args(rest)
    return int(module.main(args) or 0)

