"""Run a blocking function in a dedicated thread and await it without leaving the thread behind.

``asyncio.to_thread`` cannot stop its thread when the awaiting task is cancelled. Here the caller's
cancellation still waits (polling, so the event loop keeps serving the thread's own
``run_coroutine_threadsafe`` calls, which the runtime cancels) until the thread has returned.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

__all__ = ["run_in_thread"]

_POLL_S = 0.01


async def run_in_thread(fn: Callable[..., Any], *args: Any, on_cancel: Callable[[], None] | None = None) -> Any:
    """``fn(*args)`` in a new thread; on cancellation call ``on_cancel`` and wait for the thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def target() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    thread = threading.Thread(target=target, name=f"kvflow-agent:{getattr(fn, '__name__', 'fn')}", daemon=True)
    thread.start()
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        while thread.is_alive():
            await asyncio.sleep(_POLL_S)
        await asyncio.sleep(0)  # let the thread's last call_soon_threadsafe settle the future
        if future.done() and not future.cancelled():
            future.exception()  # retrieved: the run is cancelled, its outcome no longer matters
        raise


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
