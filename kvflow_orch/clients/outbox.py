"""Coalesced delivery of out-of-band steps updates: one queue, pumped from a task or a thread.

A workflow only ever *puts* an update, which returns at once; a pump delivers the queue in the
background. The queue (:class:`StepsQueue`) keeps

* at most one update per workflow, in arrival order: a newer update replaces the queued one in
  place, so a burst of node starts and finishes costs one request, not one per event;
* ``done`` final: later updates of the workflow do not replace a queued ``done``;
* nothing of a workflow that ends before the server heard of it (no hinted request announced it,
  none of its updates was delivered or is in flight): its queued update and its ``done`` go;
* at most ``max_pending`` workflows: one more drops the oldest queued update (``dropped`` counts
  them), since a lost update only costs cache efficiency.

A failed delivery is logged, never raised. :class:`Outbox` pumps from an asyncio task (the runtime's
HTTP client, the gateway's per-worker steps router); :class:`OutboxThread` from a thread of its
own, started on demand and gone after ``idle_s`` without work (the LangGraph adapter, whose
callbacks run on any thread and must never wait for the network).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Generic, Protocol, TypeVar

from ..protocol import StepsUpdate

__all__ = ["StepsQueue", "Outbox", "OutboxThread", "Sender"]

log = logging.getLogger("kvflow.runtime")

Key = tuple[str, ...]
"""A workflow's key in a queue; it ends with the workflow id (what failures are logged by)."""


class _Update(Protocol):
    @property
    def done(self) -> bool: ...


U = TypeVar("U", bound=_Update)


class StepsQueue(Generic[U]):
    """The updates waiting to be delivered (see the module docstring). Not thread-safe: one event
    loop, or a pump holding its lock, calls it."""

    def __init__(self, *, max_pending: int = 4096, max_heard: int = 16384, logger: logging.Logger = log) -> None:
        if max_pending < 1 or max_heard < 1:
            raise ValueError(f"max_pending and max_heard must be >= 1, got {max_pending} and {max_heard}")
        self.max_pending = max_pending
        self.max_heard = max_heard
        self.dropped = 0
        """Updates dropped because ``max_pending`` workflows were waiting."""
        self._log = logger
        self._pending: OrderedDict[Key, U] = OrderedDict()
        self._heard: OrderedDict[Key, None] = OrderedDict()  # the server knows them; bounded LRU
        self._inflight: Key | None = None

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> bool:
        """An update has been taken and not yet settled."""
        return self._inflight is not None

    def put(self, key: Key, update: U, *, announced: bool = False) -> bool:
        """Queue ``update`` of workflow ``key``; False when nothing needs sending for it.

        ``announced``: the server may have heard of the workflow in a way this queue did not see
        (a hinted request), so a ``done`` must go even if none of its updates did."""
        queued = self._pending.get(key)
        if queued is not None and queued.done:
            return False
        if update.done and not announced and key not in self._heard and key != self._inflight:
            self._pending.pop(key, None)  # the server never heard of it: nothing to end
            return False
        if queued is None and len(self._pending) >= self.max_pending:
            self._pending.popitem(last=False)
            self.dropped += 1
        self._pending[key] = update
        return True

    def announce(self, key: Key) -> None:
        """The server heard of workflow ``key`` (a hinted request reached it)."""
        heard = self._heard
        if key in heard:
            heard.move_to_end(key)
            return
        heard[key] = None
        if len(heard) > self.max_heard:
            heard.popitem(last=False)

    def take(self) -> tuple[Key, U] | None:
        """The oldest queued update, now in flight until :meth:`settle`; None when empty."""
        if not self._pending:
            return None
        key, update = self._pending.popitem(last=False)
        self._inflight = key
        return key, update

    def settle(self, key: Key, update: U, error: Exception | None, destination: str) -> None:
        """End the delivery :meth:`take` began; ``error``: what it raised (None: delivered)."""
        self._inflight = None
        if error is not None:
            self._log.warning("steps update for workflow %r not delivered to %s: %s", key[-1], destination, error)
        elif update.done:
            self._heard.pop(key, None)
        else:
            self.announce(key)

    def clear(self) -> None:
        """Drop every queued update and forget the one in flight (its pump was cancelled)."""
        self._pending.clear()
        self._inflight = None


def _key(update: StepsUpdate) -> Key:
    return (update.namespace, update.workflow_id)


class Outbox:
    """Delivers :class:`StepsUpdate`\\ s with ``deliver(update)`` from one task of the running
    event loop; failures are logged naming ``destination``. Use from one event loop at a time.

    ``held``: queue, but send nothing until :meth:`release` (whether the server takes updates is
    not known yet); :meth:`discard` drops what was held (it does not).
    """

    def __init__(self, deliver: Callable[[StepsUpdate], Awaitable[None]], destination: str, *,
                 held: bool = False) -> None:
        self._deliver = deliver
        self._destination = destination
        self._queue: StepsQueue[StepsUpdate] = StepsQueue()
        self._held = held
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, update: StepsUpdate, *, announced: bool = False) -> None:
        """Queue ``update`` (see :meth:`StepsQueue.put`); returns at once. Call from the loop's thread."""
        if self._queue.put(_key(update), update, announced=announced) and not self._held:
            self._pump()

    def announce(self, namespace: str, workflow_id: str) -> None:
        """A hinted request of the workflow reached the server: its ``done`` must follow."""
        self._queue.announce((namespace, workflow_id))

    def release(self) -> None:
        """Start sending what was held, and every later update at once."""
        self._held = False
        if self._queue:
            self._pump()

    def discard(self) -> None:
        """Drop every queued update (the server takes none)."""
        self._queue.clear()

    def _pump(self) -> None:
        task = self._task
        if task is None or task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="kvflow-steps")

    async def _drain(self) -> None:
        queue = self._queue
        while (taken := queue.take()) is not None:
            key, update = taken
            try:
                await self._deliver(update)
            except Exception as exc:  # a lost update only costs cache efficiency, never the workflow
                queue.settle(key, update, exc, self._destination)
            else:
                queue.settle(key, update, None, self._destination)

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
        self._queue.clear()


class Sender(Protocol):
    """What an :class:`OutboxThread` delivers with; one per thread, closed when the thread ends."""

    def send(self, update: Any) -> None:
        """Deliver ``update``; raise on failure."""

    def close(self) -> None:
        """Release the connections the sends opened."""


class OutboxThread(Generic[U]):
    """Pumps a :class:`StepsQueue` from a thread started on demand; thread-safe, never blocks.

    Each thread opens a :class:`Sender` with ``open_sender()`` and closes it when it leaves after
    ``idle_s`` without work; failures are logged naming ``destination(update)``. At interpreter
    exit the queue is flushed for at most ``exit_flush_s``.
    """

    def __init__(self, open_sender: Callable[[], Sender], destination: Callable[[U], str], *, name: str,
                 idle_s: float = 1.0, queue: StepsQueue[U] | None = None, exit_flush_s: float = 2.0) -> None:
        self.idle_s = idle_s
        self.queue: StepsQueue[U] = queue if queue is not None else StepsQueue()
        self._open_sender = open_sender
        self._destination = destination
        self._name = name
        self._exit_flush_s = exit_flush_s
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._exit_hook = False

    def put(self, key: Key, update: U, *, announced: bool = False) -> None:
        """Queue ``update`` of workflow ``key`` (see :meth:`StepsQueue.put`); returns at once."""
        with self._cond:
            if not self.queue.put(key, update, announced=announced):
                return
            if self._thread is None:
                self._start()
            else:
                self._cond.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued update has been attempted; False if ``timeout`` ran out."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.queue or self.queue.busy:
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
            return len(self.queue)

    def _start(self) -> None:
        if not self._exit_hook:
            atexit.register(self.flush, self._exit_flush_s)
            self._exit_hook = True
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sender = self._open_sender()
        try:
            while (taken := self._next()) is not None:
                key, update = taken
                error: Exception | None = None
                try:
                    sender.send(update)
                except Exception as exc:  # a lost update only costs cache efficiency, never the workflow
                    error = exc
                where = self._destination(update) if error is not None else ""
                with self._cond:
                    self.queue.settle(key, update, error, where)
                    self._cond.notify_all()
        finally:
            sender.close()

    def _next(self) -> tuple[Key, U] | None:
        """The next update to send; None (and the thread is gone) after ``idle_s`` without one."""
        with self._cond:
            deadline = time.monotonic() + self.idle_s
            while not self.queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._thread = None
                    self._cond.notify_all()
                    return None
                self._cond.wait(left)
            return self.queue.take()
