"""One process-wide thread that posts queued steps updates for every instrumented LangGraph app.

Callbacks call :meth:`Delivery.put` with plain data (a :class:`Snapshot` of the steps, the
destination URL and headers, and the backend's probe) and it returns at once; the thread builds
and validates a :class:`StepsUpdate` only for the snapshots it sends. Nothing of the caller's
context travels: the thread is a plain ``threading.Thread`` (which starts with an empty context),
created on demand, and it exits after ``idle_s`` without work, closing its HTTP connections. At
interpreter exit the queue is flushed for at most a couple of seconds.

The queue holds at most one update per ``(url, namespace, workflow_id)`` in arrival order: a newer
update replaces the queued one in place (a ``done`` one stays final), in O(1). A workflow that
ends before the server heard of it (no hinted request, no update delivered) is dropped whole.
An update for many workers behind a gateway goes to its :class:`Sink` (the backend's steps router),
which the thread drives on an event loop of its own, closed with the thread. When
``max_pending`` workflows are waiting, the oldest queued update is dropped: a lost update only
costs cache efficiency.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import ssl
import threading
import time
from collections import OrderedDict
from typing import Callable, NamedTuple, Protocol

import httpx

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


class Delivery:
    def __init__(self, *, idle_s: float = 1.0, max_pending: int = 4096, max_known: int = 16384) -> None:
        self.idle_s = idle_s
        self.max_pending = max_pending
        self.max_known = max_known
        self.dropped = 0
        self._cond = threading.Condition()
        self._pending: OrderedDict[tuple[str, str, str], _Item] = OrderedDict()
        self._known: OrderedDict[tuple[str, str, str], None] = OrderedDict()  # delivered at least once
        self._busy = False
        self._inflight: tuple[str, str, str] | None = None
        self._thread: threading.Thread | None = None
        self._exit_hook = False

    # ----------------------------------------------------------------- producer side
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
        with self._cond:
            queued = self._pending.get(key)
            if queued is not None and queued.update.done:
                return
            if update.done and not announced and key not in self._known and key != self._inflight:
                self._pending.pop(key, None)  # the server never heard of it: nothing to end
                return
            if queued is None and len(self._pending) >= self.max_pending:
                self._pending.popitem(last=False)
                self.dropped += 1
            self._pending[key] = _Item(url, headers, update, probe, sink)
            if self._thread is None:
                self._start()
            else:
                self._cond.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued update has been attempted; False if ``timeout`` ran out."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    @property
    def running(self) -> bool:
        with self._cond:
            return self._thread is not None

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    # ----------------------------------------------------------------- delivery thread
    def _start(self) -> None:
        if not self._exit_hook:
            atexit.register(self._at_exit)
            self._exit_hook = True
        self._thread = threading.Thread(target=self._run, name="kvflow-langgraph-steps", daemon=True)
        self._thread.start()

    def _at_exit(self) -> None:
        self.flush(2.0)

    def _run(self) -> None:
        clients: dict[tuple[str, tuple[tuple[str, str], ...]], httpx.Client] = {}
        sinks: dict[int, Sink] = {}
        loop: asyncio.AbstractEventLoop | None = None
        try:
            while True:
                with self._cond:
                    deadline = time.monotonic() + self.idle_s
                    while not self._pending:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            self._thread = None
                            self._cond.notify_all()
                            return
                        self._cond.wait(left)
                    key, item = self._pending.popitem(last=False)
                    self._busy, self._inflight = True, key
                try:
                    if item.sink is not None:
                        loop = loop or asyncio.new_event_loop()
                        sinks[id(item.sink)] = item.sink
                    self._deliver(clients, key, item, loop)
                finally:
                    with self._cond:
                        self._busy, self._inflight = False, None
                        self._cond.notify_all()
        finally:
            for client in clients.values():
                client.close()
            if loop is not None:
                for sink in sinks.values():
                    try:
                        loop.run_until_complete(sink.aclose())
                    except Exception as exc:  # noqa: BLE001 - closing connections only
                        log.warning("closing the steps router failed: %s", exc)
                loop.close()

    def _deliver(self, clients: dict, key: tuple[str, str, str], item: _Item,
                 loop: asyncio.AbstractEventLoop | None) -> None:
        try:
            if not item.probe():
                return
            if item.sink is not None and loop is not None:
                item.sink.route(item.update, loop)  # the router logs what a worker did not take
            else:
                client = clients.get((item.url, item.headers))
                if client is None:
                    client = clients[(item.url, item.headers)] = httpx.Client(
                        base_url=item.url, timeout=_TIMEOUT_S, headers=dict(item.headers), verify=tls_context()
                    )
                client.post(STEPS_ROUTE, json=item.update.build().model_dump(mode="json")).raise_for_status()
        except Exception as exc:  # a lost update only costs cache efficiency, never the workflow
            log.warning("steps update for workflow %r not delivered to %s: %s", key[2], item.url, exc)
            return
        with self._cond:
            if item.update.done:
                self._known.pop(key, None)
            else:
                self._known[key] = None
                while len(self._known) > self.max_known:
                    self._known.popitem(last=False)


_DELIVERY = Delivery()


def delivery() -> Delivery:
    """The process-wide delivery queue."""
    return _DELIVERY
