"""Many workflows at once over one backend, each with its own workflow id.

    python examples/concurrent.py [BACKEND] [N]        # default: local:tiny-random, 4 workflows

The engine sees every instance's steps separately: the same agent can be "next" for one instance
and "never again" for another, and its fixed prompt is kept while any instance still needs it.
"""

from __future__ import annotations

import os
import sys

if __name__ == "concurrent":
    # Running any script in examples/ puts this folder first on the import path, so asyncio's
    # `import concurrent.futures` finds this file instead of the standard library package. Step
    # aside: load the real package and leave it where the import system looks for it. (Everything
    # below only defines names, so nothing else runs in this case.)
    import importlib

    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    del sys.modules["concurrent"]
    sys.modules["concurrent"] = importlib.import_module("concurrent")
    sys.path.insert(0, _here)

QUESTIONS = [
    "Is a 5% dividend yield sustainable for a utility with rising debt?",
    "How exposed is a regional bank to commercial real estate?",
    "Should a retailer with falling margins buy back shares?",
    "What drives a chip maker's inventory cycle?",
]


async def main(backend: str, n: int) -> None:
    import asyncio
    import time

    from kvflow_orch import arun
    from kvflow_orch.clients import open_client
    from workflows.peer import peer

    workflow = peer(rounds=1, max_tokens=32)
    client = open_client(backend).client  # one client (and engine) shared by every instance
    started = time.perf_counter()
    try:
        results = await asyncio.gather(
            *(arun(workflow, {"question": QUESTIONS[i % len(QUESTIONS)]}, backend=client, namespace="research")
              for i in range(n))
        )
    finally:
        await client.aclose()
    took = time.perf_counter() - started
    for r in results:
        cached = sum(c.cached_tokens for c in r.calls)
        prompt = sum(c.prompt_tokens for c in r.calls)
        print(f"{r.workflow_id}: {len(r.calls)} calls, {cached}/{prompt} prompt tokens from cache")
    print(f"{n} workflows in {took:.1f} s")


if __name__ == "__main__":
    import asyncio

    backend = sys.argv[1] if len(sys.argv) > 1 else "local:tiny-random"
    asyncio.run(main(backend, int(sys.argv[2]) if len(sys.argv) > 2 else 4))
