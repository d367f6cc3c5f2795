"""The kvflow server an instrumented LangGraph app talks to: capability probe and steps updates.

``GET /kvflow/v1/info`` is probed once per origin and read as the runtime's clients read it
(:mod:`kvflow_orch.clients.probe`): its ``hints.openai`` says where requests carry the hint
(``custom_params.kvflow`` when it names none, ``kv_transfer_params.kvflow`` for vLLM; naming only
locations this version does not know is a :class:`~kvflow_orch.protocol.HintLocationError` raised
into the LLM call). An origin without it is a plain OpenAI-compatible server: requests to it carry
no hints and one :class:`~kvflow_orch.clients.probe.PlainServerWarning` says so. The probe and the
updates send ``Authorization: Bearer $KVFLOW_API_KEY`` when that variable is set, as the runtime's
HTTP client does (a server started with ``--api-key`` refuses them otherwise). ``backend_url`` may
be the server's root or its OpenAI base URL (``.../v1``, as given to ``ChatOpenAI``).

A gateway (SGLang's ``smg``) in front of many kvflow workers: ``backend_url`` is the gateway and
``workers`` its worker URLs, or ``backend_url="smg+http://HOST:PORT"`` reads them from the gateway's
``GET /workers``. The probe then asks the workers (the gateway answers 404 for ``/kvflow/v1/*``),
requests carry the routing header chosen by ``routing`` (see :mod:`kvflow_orch.clients.gateway`),
and updates go through a :class:`~kvflow_orch.clients.steps_router.StepsRouter`: to the workers
that served the workflow (the transport reports ``x-smg-routed-worker-id``), ``done`` to every one.
The router lives on the delivery thread's event loop; the workers the transport reports are handed
to it there, before the next update it routes.

Out-of-band updates (``POST /kvflow/v1/steps``) are queued from LangGraph callbacks, which may run
on any thread, and delivered by the process-wide :mod:`._delivery` thread: the graph never waits
for them, and nothing of the caller's context travels with them.
"""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..clients.gateway import GatewayConfig, Routing, workers_from_listing
from ..clients.http import HttpConfig, json_object
from ..clients.probe import InfoAnswer, PlainServerWarning, ServerProbe, read_info, read_worker_infos, workers_unknown
from ..clients.steps_router import StepsRouter
from ..protocol import CUSTOM_PARAMS, INFO_ROUTE, HintLocationError
from ._delivery import Snapshot, delivery, tls_context

__all__ = ["Backend", "origin_of"]

_PROBE_TIMEOUT_S = 5.0


def origin_of(url: str) -> str:
    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}"


class Backend:
    """Probe results per origin and the steps outbox of one instrumentation.

    ``url`` is the explicit ``backend_url``; without it, the first kvflow origin an LLM request
    reaches becomes the destination of steps updates (updates before that are dropped).
    """

    def __init__(self, url: str | None, *, workers: Any = None, routing: Routing | None = None) -> None:
        discover = url is not None and str(url).startswith(("smg+http://", "smg+https://"))
        if discover:
            url = str(url).removeprefix("smg+")
        if url is not None and not str(url).startswith(("http://", "https://")):
            raise ValueError(f"backend_url must start with http://, https:// or smg+http(s)://, got {url!r}")
        if isinstance(workers, str):
            raise ValueError(f"workers must be a list of worker URLs, got the string {workers!r}")
        workers = list(workers or ())
        if workers and discover:
            raise ValueError("pass either workers= or backend_url='smg+http://...' (discovery), not both")
        self.gateway = discover or bool(workers)
        if (workers or routing is not None) and (url is None or not self.gateway):
            what = "workers=" if workers else "routing="
            raise ValueError(f"{what} needs a gateway: backend_url= plus workers=, or backend_url='smg+http://HOST:PORT'")
        if routing is not None and routing not in ("workflow", "agent", "none"):
            raise ValueError(f"routing must be 'workflow', 'agent' or 'none', got {routing!r}")
        self.routing: Routing | None = (routing or "agent") if self.gateway else None
        """The routing header's grouping (None: not a gateway, no header)."""
        defaults = GatewayConfig if self.gateway else HttpConfig
        self.retries: int = defaults.retries
        self.backoff_s: float = defaults.backoff_s
        """How the transport retries a hinted request that failed before any answer (as the clients do)."""
        self.url = _server_root(url) if url else None
        self._api_key = os.environ.get("KVFLOW_API_KEY") or None
        self._headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
        self._lock = threading.Lock()
        self._kvflow: dict[str, bool] = {}
        self._locations: dict[str, str] = {}  # origin -> where its requests carry the hint
        # A gateway's router: built once its workers are known, then used on the delivery thread only.
        self._workers = [_server_root(w) for w in workers]
        self.router: StepsRouter | None = None
        self._served: list[tuple[str, str, str]] = []  # (namespace, workflow_id, worker) not yet routed

    # ------------------------------------------------------------------ probing
    def probed(self, request_url: str | None = None) -> bool | None:
        """The cached answer of :meth:`supports_hints`, None when it would have to probe."""
        target = self.url or (origin_of(request_url) if request_url else None)
        with self._lock:
            return False if target is None else self._kvflow.get(target)

    def hint_location(self, request_url: str | None = None) -> str:
        """Where a request to ``request_url`` carries the hint (after :meth:`supports_hints`)."""
        target = self.url or (origin_of(request_url) if request_url else None)
        with self._lock:
            return self._locations.get(target or "", CUSTOM_PARAMS)

    def supports_hints(self, request_url: str | None = None) -> bool:
        """Whether hints should be sent (probing ``backend_url``, else the request's origin).

        Raises :class:`HintLocationError` when the server names no hint location this version knows."""
        target = self.url or (origin_of(request_url) if request_url else None)
        if target is None:
            return False
        with self._lock:
            known = self._kvflow.get(target)
        if known is not None:
            return known
        probe = self._probe_gateway(target) if self.gateway else read_info(_get_info(target, self._headers))
        if probe.location_error:
            raise HintLocationError(probe.location_error)
        with self._lock:
            first = target not in self._kvflow
            self._kvflow.setdefault(target, probe.kvflow)
            if probe.kvflow:
                self._locations.setdefault(target, probe.hint_location)
                if self.url is None:
                    self.url = target
        if first and probe.warning:
            warnings.warn(probe.warning, PlainServerWarning, stacklevel=2)
        return probe.kvflow

    def _probe_gateway(self, gateway: str) -> ServerProbe:
        """Find the gateway's workers (given or listed) and probe them; with a kvflow worker among
        them, the router that will carry the updates."""
        workers = self._workers
        if not workers:
            try:
                listing = httpx.get(gateway + "/workers", timeout=_PROBE_TIMEOUT_S, headers=self._headers,
                                    verify=tls_context())
                workers = workers_from_listing(gateway, listing)
            except Exception as exc:  # unreachable or no workers: no hints, one warning
                return workers_unknown(gateway, exc)
        probe = read_worker_infos(gateway, [_get_info(worker, self._headers) for worker in workers])
        if probe.kvflow:
            with self._lock:
                if self.router is None:
                    self.router = StepsRouter(workers, timeout_s=_PROBE_TIMEOUT_S, api_key=self._api_key)
        return probe

    # ------------------------------------------------------------------ updates
    def send(self, update: Snapshot, *, announced: bool = True) -> None:
        """Queue the steps ``update`` (coalesced per workflow); never blocks, never raises.

        ``announced``: the workflow already made a hinted request (a workflow that ends before the
        server heard of it sends nothing). A first probe of the server runs on the delivery thread.
        """
        if self.url is None or self.probed() is False:
            return
        headers = tuple(self._headers.items()) if self._headers else ()
        sink = self if self.gateway else None
        delivery().put(self.url, headers, update, self.supports_hints, announced=announced, sink=sink)

    def served_by(self, namespace: str, workflow_id: str, worker: str) -> None:
        """The gateway says ``worker`` served a call of the workflow (recorded; never blocks)."""
        with self._lock:
            self._served.append((namespace, workflow_id, worker))

    def route(self, update: Snapshot, loop: asyncio.AbstractEventLoop) -> None:
        """On the delivery thread: hand the reported workers and ``update`` to the router, then
        wait until its per-worker outboxes attempted them."""
        router = self.router
        if router is None:
            return
        with self._lock:
            served, self._served = self._served, []

        async def route() -> None:
            for namespace, workflow_id, worker in served:
                if worker.startswith(("http://", "https://")):
                    router.served_by(namespace, workflow_id, worker)
            router.send(update.build())
            await router.flush(_PROBE_TIMEOUT_S)

        loop.run_until_complete(route())

    async def aclose(self) -> None:
        """On the delivery thread, before its loop closes: drop the router's connections."""
        if self.router is not None:
            await self.router.aclose()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s) until every queued update has been attempted."""
        delivery().flush(timeout)

    def close(self) -> None:
        """Flush the queued updates (the shared delivery thread stops by itself when idle)."""
        self.flush()


def _server_root(url: str) -> str:
    """``url`` without a trailing ``/`` or OpenAI ``/v1`` (the kvflow routes live at the root)."""
    path = urlsplit(url).path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return origin_of(url) + path


def _get_info(url: str, headers: dict[str, str] | None) -> InfoAnswer:
    try:
        response = httpx.get(url + INFO_ROUTE, timeout=_PROBE_TIMEOUT_S, headers=headers, verify=tls_context())
    except httpx.HTTPError:
        return InfoAnswer(url, None)
    return InfoAnswer(url, response.status_code, json_object(response) if response.status_code == 200 else None)
