"""Running an external serving engine (SGLang, vLLM) from ``kvflow serve --engine ...``.

Each engine's launcher turns ``kvflow serve``'s flags into a :class:`LaunchPlan`; this module runs
a plan in the foreground the same way for every engine: the engine leads its own session, the
signals that stop ``kvflow serve`` stop it, and nothing of it outlives ``kvflow serve``
(:mod:`backends.process_group`). Not a host: both plugins import it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from .process_group import run_foreground

__all__ = ["LaunchPlan", "ServeOptions", "run_plan", "serve_options"]


@dataclass(frozen=True)
class LaunchPlan:
    """An engine's command line and the environment additions it needs."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


class ServeOptions(NamedTuple):
    """The engine-agnostic flags of ``kvflow serve``, which every engine's ``build_command`` takes as
    keyword arguments of these names (and unpacks in this order)."""

    policy: str = "kvflow"
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    device_tokens: int | None = None
    host_tokens: int | None = None
    prefetch: bool = True


def serve_options(args: Any, default_policy: str) -> dict[str, Any]:
    """``kvflow serve``'s parsed flags as :class:`ServeOptions` keywords for a launcher; attributes
    ``args`` lacks take their defaults."""
    given = {name: getattr(args, name) for name in ServeOptions._fields if name != "prefetch" and hasattr(args, name)}
    prefetch = not getattr(args, "no_prefetch", False)
    return ServeOptions(**{"policy": default_policy, **given}, prefetch=prefetch)._asdict()


def run_plan(make_plan: Callable[[], LaunchPlan], *, package: str, missing: str) -> int:
    """Build the plan (a ValueError is a usage error: exit 2, one line), check that ``package`` is
    importable here (else print ``missing``, exit 2), print the command, run it until it exits or
    ``kvflow serve`` is told to stop (SIGTERM, SIGINT, SIGHUP: passed on, then whatever is left of
    the engine is killed after a grace period)."""
    try:
        plan = make_plan()
    except ValueError as exc:
        print(f"kvflow serve: {exc}", file=sys.stderr)
        return 2
    if importlib.util.find_spec(package) is None:
        print(f"kvflow serve: {missing}", file=sys.stderr)
        return 2
    print("kvflow serve: " + " ".join(f"{k}={v}" for k, v in plan.env.items()) + " " + " ".join(plan.argv),
          file=sys.stderr, flush=True)
    return run_foreground(plan.argv, env={**os.environ, **plan.env})
