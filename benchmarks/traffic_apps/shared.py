"""What every traffic app shares: the truth headers, the command line, running sessions at once.

The command line is ``tests/frameworks/apps``' (``--base-url``, ``--model``, ``--sessions``) plus
``--max-tokens``. Every app is greedy (``temperature=0``), so a replay of its recording on the same
model gets the replies the app got. A session that fails on the small model's output (a reply the
framework cannot parse, a turn limit) ends there and its outcome says why: its requests so far are
still a representative stream.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "frameworks" / "apps"))

from app_args import app_parser, served_model

__all__ = ["TRUTH_AGENT", "TRUTH_SESSION", "truth", "parser", "served_model", "run_sessions", "report"]

TRUTH_AGENT = "x-truth-agent"
TRUTH_SESSION = "x-truth-session"


def truth(agent: str, session: str) -> dict[str, str]:
    """The headers the client of ``agent`` in ``session`` sends (the proxy strips them)."""
    return {TRUTH_AGENT: agent, TRUTH_SESSION: session}


def parser(doc: str):
    p = app_parser(doc)
    p.add_argument("--max-tokens", type=int, default=32)
    return p


async def run_sessions(n: int, session: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """``session(i)`` for ``i < n``, all at once; a session that raises ends with its error's name."""
    async def guarded(i: int) -> Any:
        try:
            return await session(i)
        except Exception as exc:  # the framework gave up on the model's output: the session ends here
            print(f"session {i}: {''.join(traceback.format_exception_only(exc)).strip()[:300]}", file=sys.stderr)
            return f"ended: {type(exc).__name__}"
    return list(await asyncio.gather(*(guarded(i) for i in range(n))))


def report(app: str, outcomes: list[Any], **extra: Any) -> None:
    print(json.dumps({"app": app, **extra, "outcomes": outcomes}, default=str))
