"""Coalescing delivery of out-of-band steps updates.

The workflow only ever calls :meth:`Outbox.put`, which returns at once. A single background task
delivers the queued updates; while one is in flight, newer updates for the same workflow replace
the pending one, so a burst of node starts and finishes costs one request, not one per event.
A ``done`` update is final: later updates for that workflow do not replace it before it is sent.

Used by the runtime's :class:`~kvflow_orch.clients.http.HttpClient` and by the LangGraph adapter's
backend, so both deliver steps the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

from ..protocol import StepsUpdate

__all__ = ["Outbox"]

log = logging.getLogger("kvflow.runtime")


class Outbox:
    """Queue of steps updates, at most one pending per ``(namespace, workflow_id)``.

    ``deliver(update)`` sends one update; its failures are logged (naming ``backend``), never
    raised: a lost update only costs cache efficiency. Must be used from one event loop.
    """

    def __init__(self, deliver: Callable[[StepsUpdate], Awaitable[None]], backend: str) -> None:
        self._deliver = deliver
        self._backend = backend
        self._pending: dict[tuple[str, str], StepsUpdate] = {}
        self._task: asyncio.Task[None] | None = None

    def put(self, update: StepsUpdate) -> None:
        """Queue ``update`` (replacing a pending one of its workflow unless that one is done);
        returns at once. Call from the loop's thread."""
        key = (update.namespace, update.workflow_id)
        queued = self._pending.get(key)
        if queued is not None and queued.done:
            return
        self._pending[key] = update
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="kvflow-steps")

    async def _drain(self) -> None:
        while self._pending:
            key = next(iter(self._pending))
            update = self._pending.pop(key)
            try:
                await self._deliver(update)
            except Exception as exc:  # a lost hint only costs cache efficiency, never the workflow
                log.warning("steps update for workflow %r not delivered to %s: %s", key[1], self._backend, exc)

    async def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the queued updates to be delivered."""
        task = self._task
        if task is None or task.done():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), timeout)

    async def close(self, timeout: float) -> None:
        """Flush for up to ``timeout`` seconds, then drop whatever is still queued."""
        await self.flush(timeout)
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pending.clear()
