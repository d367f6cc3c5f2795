"""One process-wide thread that posts queued steps updates for every instrumented LangGraph app.

Callbacks call :meth:`Delivery.put` with plain data (a :class:`Snapshot` of the steps, the
destination URL and headers, and the backend's probe) and it returns at once; the thread builds
and validates a :class:`StepsUpdate` only for the snapshots it sends. Nothing of the caller's
context travels: the thread is a plain ``threading.Thread`` (which starts with an empty context),
created on demand, and it exits after ``idle_s`` without work, closing its HTTP connections. At
interpreter exit the queue is flushed for at most a couple of seconds.

The queue and the thread are the runtime's (:class:`~kvflow_orch.clients.outbox.StepsQueue` pumped
by an :class:`~kvflow_orch.clients.outbox.OutboxThread`), keyed by ``(url, namespace,
workflow_id)``: one update per workflow in arrival order, ``done`` final, a workflow that ends
before the server heard of it dropped whole, the oldest update dropped when ``max_pending``
workflows wait. An update for many workers behind a gateway goes to its :class:`Sink` (the
backend's steps router), which the thread drives on an event loop of its own, closed with the
thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from typing import Callable, NamedTuple, Protocol

import httpx

from ..clients.outbox import OutboxThread, StepsQueue
from ..hinting import WorkflowHints
from ..protocol import STEPS_ROUTE, StepsUpdate

__all__ = ["Delivery", "Sink", "Snapshot", "delivery", "tls_context"]

log = logging.getLogger("kvflow.langgraph")

_TIMEOUT_S = 5.0


@functools.lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """One TLS context for every client here (building one loads the CA bundle: milliseconds)."""
    return ssl.create_default_context()


class Snapshot(NamedTuple):
    """A workflow's agent steps at one moment (``done``: the workflow has ended)."""

    hints: WorkflowHints
    steps: dict[str, float]
    done: bool = False

    def agent_steps(self) -> dict[str, float]:
        return self.steps

    def build(self) -> StepsUpdate:
        return self.hints.update(self, done=self.done)


class Sink(Protocol):
    """Delivers updates itself (to many workers), on the delivery thread's event loop."""

    def route(self, update: Snapshot, loop: asyncio.AbstractEventLoop) -> None: ...

    async def aclose(self) -> None: ...


class _Item(NamedTuple):
    url: str
    headers: tuple[tuple[str, str], ...]
    update: Snapshot
    probe: Callable[[], bool]
    sink: Sink | None = None

    @property
    def done(self) -> bool:
        return self.update.done


class Delivery:
    """The process-wide queue of the LangGraph adapter's steps updates (see the module docstring)."""

    def __init__(self, *, idle_s: float = 1.0, max_pending: int = 4096, max_known: int = 16384) -> None:
        queue: StepsQueue[_Item] = StepsQueue(max_pending=max_pending, max_heard=max_known, logger=log)
        self._outbox = OutboxThread(_Sender, lambda item: item.url, name="kvflow-langgraph-steps", idle_s=idle_s,
                                    queue=queue)

    @property
    def idle_s(self) -> float:
        return self._outbox.idle_s

    @property
    def dropped(self) -> int:
        """Updates dropped because ``max_pending`` workflows were waiting."""
        return self._outbox.queue.dropped

    def put(
        self,
        url: str,
        headers: tuple[tuple[str, str], ...],
        update: Snapshot,
        probe: Callable[[], bool],
        *,
        announced: bool,
        sink: Sink | None = None,
    ) -> None:
        """Queue ``update`` for ``url`` (or for ``sink`` to deliver); ``announced``: the workflow
        already sent a hinted request."""
        key = (url, update.hints.namespace, update.hints.workflow_id)
        self._outbox.put(key, _Item(url, headers, update, probe, sink), announced=announced)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued update has been attempted; False if ``timeout`` ran out."""
        return self._outbox.flush(timeout)

    @property
    def running(self) -> bool:
        return self._outbox.running

    def pending(self) -> int:
        return self._outbox.pending()


class _Sender:
    """The delivery thread's connections: an HTTP client per (url, headers), and an event loop
    for the gateways' routers (opened on first use, closed with the thread)."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, tuple[tuple[str, str], ...]], httpx.Client] = {}
        self._sinks: dict[int, Sink] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def send(self, item: _Item) -> None:
        if not item.probe():
            return
        if item.sink is not None:
            self._loop = self._loop or asyncio.new_event_loop()
            self._sinks[id(item.sink)] = item.sink
            item.sink.route(item.update, self._loop)  # the router logs what a worker did not take
            return
        client = self._clients.get((item.url, item.headers))
        if client is None:
            client = self._clients[(item.url, item.headers)] = httpx.Client(
                base_url=item.url, timeout=_TIMEOUT_S, headers=dict(item.headers), verify=tls_context()
            )
        client.post(STEPS_ROUTE, json=item.update.build().model_dump(mode="json")).raise_for_status()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        if self._loop is not None:
            for sink in self._sinks.values():
                try:
                    self._loop.run_until_complete(sink.aclose())
                except Exception as exc:  # closing connections only
                    log.warning("closing the steps router failed: %s", exc)
            self._loop.close()


_DELIVERY = Delivery()


def delivery() -> Delivery:
    """The process-wide delivery queue."""
    return _DELIVERY
