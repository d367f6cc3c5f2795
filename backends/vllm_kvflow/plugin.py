"""The ``vllm.general_plugins`` entry point: gives vLLM's ``EngineCore`` a ``kvflow_call`` utility.

The API server reaches the engine core only through utility calls, which ``EngineCore`` dispatches
by ``getattr(self, name)``; this is the engine-side half vLLM's endpoint-plugin contract asks for
(the ``/kvflow/v1`` routes in :mod:`.routes` are the other half). Loading it more than once, in any
vLLM process, is harmless.
"""

from __future__ import annotations

from typing import Any

from . import POLICY_NAME, UTILITY

__all__ = ["register", "engine_kvflow_call"]


def engine_kvflow_call(self: Any, verb: str, payload: Any = None) -> dict[str, Any]:
    """``EngineCore.kvflow_call``: hand the verb to the scheduler when it is kvflow's; a stock
    scheduler (``--policy lru``) takes steps and pauses and ignores them, so one client (and the
    routes) drive both."""
    handler = getattr(self.scheduler, UTILITY, None)
    if handler is not None:
        return handler(verb, payload)
    if verb in ("info", "stats"):
        return {"policy": "lru"}
    if verb in ("steps", "pause"):
        return {"ok": True, "ignored": f"the {POLICY_NAME} scheduler is not loaded (stock vLLM, policy lru)"}
    raise ValueError(f"unknown kvflow verb {verb!r}; known: steps, pause, stats, info")


def register() -> None:
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore, UTILITY, None) is not engine_kvflow_call:
        setattr(EngineCore, UTILITY, engine_kvflow_call)
