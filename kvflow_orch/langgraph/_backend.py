"""The kvflow server an instrumented LangGraph app talks to: capability probe and steps updates.

``GET /kvflow/v1/info`` is probed once per origin. An origin without it is a plain
OpenAI-compatible server: requests to it carry no hints and one warning says so. The probe and the
updates send ``Authorization: Bearer $KVFLOW_API_KEY`` when that variable is set, as the runtime's
HTTP client does (a server started with ``--api-key`` refuses them otherwise).

Out-of-band updates (``POST /kvflow/v1/steps``) are queued from LangGraph callbacks, which may run
on any thread, and delivered by the runtime's coalescing :class:`~kvflow_orch.clients.outbox.Outbox`
on a private event loop thread: the graph never waits for them.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
import warnings
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..clients.outbox import Outbox
from ..protocol import INFO_ROUTE, STEPS_ROUTE, StepsUpdate

__all__ = ["Backend", "origin_of", "PlainServerWarning"]

_PROBE_TIMEOUT_S = 5.0


class PlainServerWarning(RuntimeWarning):
    """The LLM server has no kvflow routes; requests go out without hints."""


def origin_of(url: str) -> str:
    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}"


class Backend:
    """Probe results per origin and the steps outbox of one instrumentation.

    ``url`` is the explicit ``backend_url``; without it, the first kvflow origin an LLM request
    reaches becomes the destination of steps updates (updates before that are dropped).
    """

    def __init__(self, url: str | None) -> None:
        if url is not None and not str(url).startswith(("http://", "https://")):
            raise ValueError(f"backend_url must start with http:// or https://, got {url!r}")
        self.url = origin_of(url) + urlsplit(url).path.rstrip("/") if url else None
        key = os.environ.get("KVFLOW_API_KEY")
        self._headers = {"Authorization": f"Bearer {key}"} if key else None
        self._lock = threading.Lock()
        self._kvflow: dict[str, bool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._outbox: Outbox | None = None
        self._http: httpx.AsyncClient | None = None
        self._in_line: asyncio.Lock | None = None
        self._enqueuing: set[concurrent.futures.Future] = set()

    # ------------------------------------------------------------------ probing
    def probed(self, request_url: str | None = None) -> bool | None:
        """The cached answer of :meth:`supports_hints`, None when it would have to probe."""
        target = self.url or (origin_of(request_url) if request_url else None)
        with self._lock:
            return False if target is None else self._kvflow.get(target)

    def supports_hints(self, request_url: str | None = None) -> bool:
        """Whether hints should be sent (probing ``backend_url``, else the request's origin)."""
        target = self.url or (origin_of(request_url) if request_url else None)
        if target is None:
            return False
        with self._lock:
            known = self._kvflow.get(target)
        if known is None:
            known, status = _probe(target, self._headers)
            with self._lock:
                first = target not in self._kvflow
                self._kvflow.setdefault(target, known)
                if known and self.url is None:
                    self.url = target
            if first and not known:
                why = (
                    f"refused {INFO_ROUTE} with HTTP {status} (set KVFLOW_API_KEY to its API key)"
                    if status in (401, 403)
                    else f"has no {INFO_ROUTE}: it is not a kvflow server"
                )
                warnings.warn(
                    f"{target} {why}, so LangGraph LLM calls carry no hints and the cache will not "
                    f"follow the workflow",
                    PlainServerWarning,
                    stacklevel=2,
                )
        return known

    # ------------------------------------------------------------------ updates
    def send(self, update: StepsUpdate) -> None:
        """Queue ``update`` (coalesced per workflow); never blocks, never raises.

        Updates go out in the order they were sent: a first probe of the server runs on the
        delivery thread, and updates wait for it in line.
        """
        if self.url is None or self.probed() is False:
            return
        loop = self._ensure_loop()
        future = asyncio.run_coroutine_threadsafe(self._enqueue(update), loop)
        with self._lock:
            self._enqueuing = {f for f in self._enqueuing if not f.done()} | {future}

    async def _enqueue(self, update: StepsUpdate) -> None:
        async with self._in_line:  # FIFO: keeps updates in order while the probe runs
            if self.probed() is None:
                await asyncio.to_thread(self.supports_hints)
            if self.probed():
                self._outbox.put(update)  # type: ignore[union-attr]

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    self._http = httpx.AsyncClient(
                        base_url=self.url or "", timeout=_PROBE_TIMEOUT_S, headers=self._headers
                    )
                    self._outbox = Outbox(self._post, self.url or "")
                    self._in_line = asyncio.Lock()
                    ready.set()
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="kvflow-langgraph-steps", daemon=True)
                self._thread.start()
                # The last update of a run (done=true) is queued as the app returns: deliver it
                # even when the program exits right after.
                atexit.register(self.close)
                ready.wait()
                self._loop = loop
            return self._loop

    async def _post(self, update: StepsUpdate) -> None:
        assert self._http is not None
        response = await self._http.post(STEPS_ROUTE, json=update.model_dump(mode="json"))
        response.raise_for_status()

    def _wait_enqueued(self, timeout: float) -> None:
        with self._lock:
            enqueuing = list(self._enqueuing)
        concurrent.futures.wait(enqueuing, timeout)

    def flush(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s) until every queued update has been attempted."""
        loop = self._loop
        self._wait_enqueued(timeout)
        if loop is not None and self._outbox is not None:
            asyncio.run_coroutine_threadsafe(self._outbox.flush(timeout), loop).result(timeout + 1)

    def close(self) -> None:
        """Flush, then stop the delivery thread (a later update starts it again)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None:
            return
        atexit.unregister(self.close)
        self._wait_enqueued(5.0)

        async def shutdown() -> None:
            await self._outbox.close(5.0)  # type: ignore[union-attr]
            await self._http.aclose()  # type: ignore[union-attr]

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5)
        loop.close()


def _probe(origin: str, headers: dict[str, str] | None) -> tuple[bool, int | None]:
    """(whether ``origin`` is a kvflow server, the probe's HTTP status or None when unreachable)."""
    try:
        response = httpx.get(origin + INFO_ROUTE, timeout=_PROBE_TIMEOUT_S, headers=headers)
        data: Any = response.json() if response.status_code == 200 else None
    except httpx.HTTPError:
        return False, None
    except ValueError:
        return False, response.status_code
    return isinstance(data, dict), response.status_code
