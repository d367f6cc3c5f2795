"""The kvflow server an instrumented LangGraph app talks to: capability probe and steps updates.

``GET /kvflow/v1/info`` is probed once per origin. An origin without it is a plain
OpenAI-compatible server: requests to it carry no hints and one warning says so. The probe and the
updates send ``Authorization: Bearer $KVFLOW_API_KEY`` when that variable is set, as the runtime's
HTTP client does (a server started with ``--api-key`` refuses them otherwise). ``backend_url`` may
be the server's root or its OpenAI base URL (``.../v1``, as given to ``ChatOpenAI``).

Out-of-band updates (``POST /kvflow/v1/steps``) are queued from LangGraph callbacks, which may run
on any thread, and delivered by the process-wide :mod:`._delivery` thread: the graph never waits
for them, and nothing of the caller's context travels with them.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..protocol import INFO_ROUTE
from ._delivery import Snapshot, delivery, tls_context

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
        self.url = _server_root(url) if url else None
        key = os.environ.get("KVFLOW_API_KEY")
        self._headers = {"Authorization": f"Bearer {key}"} if key else None
        self._lock = threading.Lock()
        self._kvflow: dict[str, bool] = {}

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
    def send(self, update: Snapshot, *, announced: bool = True) -> None:
        """Queue the steps ``update`` (coalesced per workflow); never blocks, never raises.

        ``announced``: the workflow already made a hinted request (a workflow that ends before the
        server heard of it sends nothing). A first probe of the server runs on the delivery thread.
        """
        if self.url is None or self.probed() is False:
            return
        headers = tuple(self._headers.items()) if self._headers else ()
        delivery().put(self.url, headers, update, self.supports_hints, announced=announced)

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


def _probe(origin: str, headers: dict[str, str] | None) -> tuple[bool, int | None]:
    """(whether ``origin`` is a kvflow server, the probe's HTTP status or None when unreachable)."""
    try:
        response = httpx.get(origin + INFO_ROUTE, timeout=_PROBE_TIMEOUT_S, headers=headers, verify=tls_context())
        data: Any = response.json() if response.status_code == 200 else None
    except httpx.HTTPError:
        return False, None
    except ValueError:
        return False, response.status_code
    return isinstance(data, dict), response.status_code
