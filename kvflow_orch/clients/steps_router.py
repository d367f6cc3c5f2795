"""Steps updates for many workers: each workflow's updates go to the workers that serve it.

Behind a gateway a workflow's calls land on one worker (affinity) or a few (per-agent routing, a
worker lost mid-run). :class:`StepsRouter` remembers which workers served each workflow and sends
its steps updates there (or to every worker with ``to="all"``), and sends ``done`` to every known
worker, so no table anywhere keeps protecting a finished workflow. A worker that serves a workflow
for the first time gets the workflow's current steps at once (the hint in the request body carries
them too). Delivery is per worker through an :class:`~.outbox.Outbox` (coalesced, never blocking,
failures logged): the fan-out is bounded by the number of workers, one request in flight each.

Used by :class:`~.gateway.GatewayClient`; an adapter with its own chat transport (LangGraph's
backend) calls :meth:`served_by` with the worker each reply came from and :meth:`send` per update.
"""

from __future__ import annotations

import asyncio
from typing import Iterable, Literal

import httpx

from ..protocol import STEPS_ROUTE, StepsUpdate
from .base import BackendError
from .outbox import Outbox

__all__ = ["StepsRouter", "StepsTarget"]

StepsTarget = Literal["served", "all"]


class StepsRouter:
    """Routes steps updates to worker URLs; use from one event loop at a time."""

    def __init__(self, workers: Iterable[str] = (), *, to: StepsTarget = "served", timeout_s: float = 5.0,
                 api_key: str | None = None) -> None:
        if to not in ("served", "all"):
            raise ValueError(f"to must be 'served' or 'all', got {to!r}")
        self.to = to
        self._timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._outboxes: dict[str, Outbox] = {}
        self._served: dict[tuple[str, str], set[str]] = {}
        self._latest: dict[tuple[str, str], StepsUpdate] = {}
        self._down: set[str] = set()  # refused a connection; skipped until it serves a call again
        self._http_client: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        for url in workers:
            self.add_worker(url)

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(self._outboxes)

    @property
    def down(self) -> frozenset[str]:
        """Workers that refused a connection and have not served a call since."""
        return frozenset(self._down)

    def add_worker(self, url: str) -> str:
        """Register a worker (idempotent); returns its normalised URL."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"worker URL must start with http:// or https://, got {url!r}")
        url = url.rstrip("/")
        if url not in self._outboxes:
            self._outboxes[url] = Outbox(lambda update, url=url: self._post(url, update), url)
        return url

    def serving(self, namespace: str, workflow_id: str) -> frozenset[str]:
        """The workers that have served the workflow so far."""
        return frozenset(self._served.get((namespace, workflow_id), ()))

    def served_by(self, namespace: str, workflow_id: str, worker: str) -> None:
        """Record that ``worker`` served a call of the workflow; a first contact gets its current steps."""
        url = self.add_worker(worker)
        self._down.discard(url)
        key = (namespace, workflow_id)
        served = self._served.setdefault(key, set())
        if url in served:
            return
        served.add(url)
        latest = self._latest.get(key)
        if latest is not None:
            self._outboxes[url].put(latest)

    def send(self, update: StepsUpdate) -> None:
        """Queue ``update`` for its workflow's workers (``done``: every worker); never blocks."""
        key = (update.namespace, update.workflow_id)
        if update.done:
            self._latest.pop(key, None)
            self._served.pop(key, None)
            targets: Iterable[str] = self._outboxes
        else:
            self._latest[key] = update
            targets = self._outboxes if self.to == "all" else self._served.get(key, ())
        for url in targets:
            if url not in self._down:
                # announced: any worker may have heard of the workflow through the gateway (a call
                # whose worker was not reported), so each one's done must go
                self._outboxes[url].put(update, announced=True)

    async def _post(self, url: str, update: StepsUpdate) -> None:
        if url in self._down:
            return
        try:
            response = await self._http.post(url + STEPS_ROUTE, json=update.model_dump(mode="json"))
        except httpx.ConnectError:
            # A lost worker holds no table worth updating; the gateway has rerouted its workflows.
            self._down.add(url)
            raise
        if response.status_code >= 400:
            raise BackendError(url, f"steps update rejected with HTTP {response.status_code}: {response.text[:300]}")

    @property
    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()  # httpx pools belong to the loop that opened them
        if self._http_client is None or self._http_loop is not loop:
            self._http_client = httpx.AsyncClient(timeout=self._timeout_s, headers=self._headers)
            self._http_loop = loop
        return self._http_client

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` seconds, all workers at once) until queued updates were attempted."""
        await asyncio.gather(*(box.flush(timeout) for box in self._outboxes.values()))

    async def aclose(self) -> None:
        await asyncio.gather(*(box.close(1.0) for box in self._outboxes.values()))
        if self._http_client is not None and self._http_loop is asyncio.get_running_loop():
            await self._http_client.aclose()
        self._http_client = None
