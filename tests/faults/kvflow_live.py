"""A real kvflow server for fault and security tests: the tiny-random engine behind the FastAPI app,
served by uvicorn on 127.0.0.1 in a thread, with the debug routes on, plus the checks every test
ends with (nothing held by a request, cache integrity, hint table size).

``ThreadServer`` is ``backends.server.serve_in_thread`` with a start and a kill instead of a
``with`` block: it can be stopped abruptly and started again on the *same* port, as the kill/restart
tests need.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator, NamedTuple

import httpx

from backends.local import Engine, EngineConfig
from backends.server import RunningServer, ServerLimits, create_app, serve_in_thread
from backends.server.debug import HINTS_ROUTE, INTEGRITY_ROUTE

__all__ = ["Live", "ThreadServer", "live_server", "tiny_engine", "wait_idle", "integrity", "hint_summary", "BUSY_KEYS"]

DEVICE_TOKENS = 4096
HOST_TOKENS = 8192
BUSY_KEYS = ("device_held", "running", "waiting", "loads_in_flight")


def tiny_engine(*, load_copy: Any = None, **config: Any) -> Engine:
    """The tiny-random engine; ``config`` overrides EngineConfig fields, ``load_copy`` is the engine's
    copy-fault seam."""
    settings = {"model": "tiny-random", "device_tokens": DEVICE_TOKENS, "host_tokens": HOST_TOKENS, **config}
    return Engine(EngineConfig.build(**settings), load_copy=load_copy)


class ThreadServer:
    """``serve_in_thread`` held open between ``start`` and ``kill``, on 127.0.0.1:``port`` (0: a free
    one, kept across restarts)."""

    def __init__(self, app: Any, port: int = 0) -> None:
        self.app = app
        self.port = port
        self._running: RunningServer | None = None
        self._stack: ExitStack | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        stack = ExitStack()
        self._running = stack.enter_context(serve_in_thread(self.app, port=self.port, start_timeout_s=timeout_s))
        self.port, self._stack = self._running.port, stack

    def kill(self, *, graceful: bool = False) -> None:
        """Stop at once: stop listening, drop connections, do not wait for requests in flight (with
        ``graceful``, let them finish and run the app's shutdown normally)."""
        running, stack = self._running, self._stack
        if running is None or stack is None:
            return
        running.server.force_exit = not graceful
        self._running = self._stack = None
        stack.close()


class Live(NamedTuple):
    url: str
    engine: Engine
    server: ThreadServer


@contextmanager
def live_server(
    engine: Engine | None = None, *, api_key: str | None = None, limits: ServerLimits | None = None,
    debug_routes: bool = True, **config: Any,
) -> Iterator[Live]:
    engine = engine or tiny_engine(**config)
    app = create_app(engine, api_key=api_key, limits=limits, debug_routes=debug_routes)
    server = ThreadServer(app)
    server.start()
    try:
        yield Live(server.url, engine, server)
    finally:
        server.kill(graceful=True)


def wait_idle(client: httpx.Client, timeout_s: float = 15.0) -> dict[str, Any]:
    """Poll ``/kvflow/v1/stats`` until no request holds a slot or a queue place and no load is in
    flight; return those stats. Raises AssertionError naming what is still held."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = client.get("/kvflow/v1/stats").json()
        held = {key: stats[key] for key in BUSY_KEYS}
        if not any(held.values()):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"still held after {timeout_s} s: {held}")
        time.sleep(0.05)


def integrity(client: httpx.Client) -> dict[str, Any]:
    response = client.get(INTEGRITY_ROUTE)
    assert response.status_code == 200, response.text
    return response.json()


def hint_summary(client: httpx.Client) -> dict[str, Any]:
    response = client.get(HINTS_ROUTE)
    assert response.status_code == 200, response.text
    return response.json()
