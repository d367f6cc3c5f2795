"""httpx transports that put the kvflow hint into OpenAI-compatible requests made inside nodes.

The transport reads LangGraph's run context: ``var_child_runnable_config`` is set around every
node (sync, thread pool and async, Python >= 3.11) and holds the callback manager of the run
that is making the request. Its handlers include the :class:`KVFlowCallbackHandler` of the
instrumented graph and its ``parent_run_id`` names the run, which the handler maps to the
workflow and node. Requests made outside an instrumented node pass through untouched, and so do
requests to a server without ``/kvflow/v1/info``; the hint goes where the server's info says
(``Backend.hint_location``). Behind a gateway the request also carries the
routing header (``x-smg-routing-key``, grouped as the backend's ``routing`` says) and the worker
the gateway names in ``x-smg-routed-worker-id`` is reported to the backend's steps router.

A request the transport hints is sent again when it failed before any of its answer reached the
caller (the connection failed or closed, or a 502/503/504: a worker lost mid-request, a gateway
with no worker left), as kvflow's own clients do (:mod:`kvflow_orch.clients.retry`; the backend's
``retries`` and ``backoff_s``). A response handed on, a streamed one included, is never retried.

Known gap: a ``ThreadPoolExecutor`` created inside a node does not copy the context; use
``langchain_core.runnables.config.ContextThreadPoolExecutor`` (or ``contextvars.copy_context()``).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from langchain_core.runnables.config import var_child_runnable_config

from ..clients.gateway import ROUTING_HEADER, WORKER_HEADER, routing_key
from ..clients.retry import Retries
from ..protocol import KVFlowHint, attach_hint
from ._callbacks import KVFlowCallbackHandler

__all__ = ["KVFlowTransport", "AsyncKVFlowTransport", "http_client", "async_http_client"]

_ROUTES = ("/v1/chat/completions", "/v1/completions")


def _handler_and_run() -> tuple[KVFlowCallbackHandler, Any] | None:
    config = var_child_runnable_config.get()
    if not config:
        return None
    callbacks = config.get("callbacks")
    handlers = getattr(callbacks, "handlers", None)
    if handlers is None:
        handlers = callbacks if isinstance(callbacks, list) else []
    run_id = getattr(callbacks, "parent_run_id", None)
    for handler in handlers:
        if isinstance(handler, KVFlowCallbackHandler) and handler.knows(run_id):
            return handler, run_id
    return None


def _candidate(request: httpx.Request) -> tuple[KVFlowCallbackHandler, Any] | None:
    if request.method != "POST" or not request.url.path.endswith(_ROUTES):
        return None
    if "json" not in request.headers.get("content-type", ""):
        return None
    return _handler_and_run()


def _with_hint(
    request: httpx.Request, handler: KVFlowCallbackHandler, run_id: Any
) -> tuple[httpx.Request, KVFlowHint | None]:
    """``request`` with the hint in its body (and the routing header behind a gateway), and the hint."""
    hint = handler.hint_for(run_id)
    if hint is None:
        return request, None
    try:
        body = json.loads(request.read() or b"{}")
    except ValueError:
        return request, None
    if not isinstance(body, dict):
        return request, None
    body = attach_hint(body, _fixed_prefix(hint, body), location=handler.backend.hint_location(str(request.url)))
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "content-length"]
    routing = handler.backend.routing
    key = routing_key(hint, routing) if routing is not None else None
    if key is not None:
        headers = [(k, v) for k, v in headers if k.lower() != ROUTING_HEADER] + [(ROUTING_HEADER, key)]
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        content=json.dumps(body).encode(),
        extensions=request.extensions,
    ), hint


def _report_worker(handler: KVFlowCallbackHandler, hint: KVFlowHint | None, response: httpx.Response) -> None:
    """Tell a gateway backend which worker served the hinted request."""
    worker = response.headers.get(WORKER_HEADER) if hint is not None and handler.backend.gateway else None
    if worker:
        handler.backend.served_by(hint.namespace, hint.workflow_id, worker)  # type: ignore[union-attr]


def _retries(request: httpx.Request, handler: KVFlowCallbackHandler) -> Retries:
    return Retries(f"{request.method} {request.url}", handler.backend.retries, handler.backend.backoff_s)


def _fixed_prefix(hint: KVFlowHint, body: dict[str, Any]) -> KVFlowHint:
    """The fixed prompt is the leading system/developer messages (None for a raw prompt)."""
    messages = body.get("messages")
    count = 0
    if isinstance(messages, list):
        for message in messages:
            if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
                break
            count += 1
    return hint.model_copy(update={"fixed_prefix": count or None})


class KVFlowTransport(httpx.BaseTransport):
    """Sync transport: adds the hint, then delegates to ``inner`` (default ``httpx.HTTPTransport``)."""

    def __init__(self, inner: httpx.BaseTransport | None = None) -> None:
        self._inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        found = _candidate(request)
        if found is None or not found[0].backend.supports_hints(str(request.url)):
            return self._inner.handle_request(request)
        request, hint = _with_hint(request, *found)
        retries = _retries(request, found[0])
        while True:
            try:
                response = self._inner.handle_request(request)
            except httpx.TransportError as exc:
                wait = retries.wait_after(exc)
                if wait is None:
                    raise
            else:
                wait = retries.wait_after(response)
                if wait is None:
                    break
                response.close()
            time.sleep(wait)
        _report_worker(found[0], hint, response)
        return response

    def close(self) -> None:
        self._inner.close()


class AsyncKVFlowTransport(httpx.AsyncBaseTransport):
    """Async twin of :class:`KVFlowTransport`; the one-time probe runs off the event loop."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        found = _candidate(request)
        if found is None:
            return await self._inner.handle_async_request(request)
        backend, url = found[0].backend, str(request.url)
        known = backend.probed(url)
        if known is None:
            known = await asyncio.to_thread(backend.supports_hints, url)
        if not known:
            return await self._inner.handle_async_request(request)
        request, hint = _with_hint(request, *found)
        retries = _retries(request, found[0])
        while True:
            try:
                response = await self._inner.handle_async_request(request)
            except httpx.TransportError as exc:
                wait = retries.wait_after(exc)
                if wait is None:
                    raise
            else:
                wait = retries.wait_after(response)
                if wait is None:
                    break
                await response.aclose()
            await asyncio.sleep(wait)
        _report_worker(found[0], hint, response)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def http_client(**kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` whose requests inside instrumented nodes carry kvflow hints.

    Pass it as ``ChatOpenAI(http_client=...)`` or ``openai.OpenAI(http_client=...)``; other
    keyword arguments go to ``httpx.Client`` (``transport=`` becomes the inner transport).
    """
    inner = kwargs.pop("transport", None)
    return httpx.Client(transport=KVFlowTransport(inner), **kwargs)


def async_http_client(**kwargs: Any) -> httpx.AsyncClient:
    """Async twin of :func:`http_client` (``ChatOpenAI(http_async_client=...)``, ``AsyncOpenAI``)."""
    inner = kwargs.pop("transport", None)
    return httpx.AsyncClient(transport=AsyncKVFlowTransport(inner), **kwargs)
