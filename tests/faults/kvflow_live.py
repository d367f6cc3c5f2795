"""A real kvflow server for fault and security tests: the tiny-random engine behind the FastAPI app,
served by uvicorn on 127.0.0.1 in a thread, with the debug routes on, plus the checks every test
ends with (nothing held by a request, cache integrity, hint table size).

``ThreadServer`` can be stopped abruptly and started again on the *same* port, which is what the
kill/restart tests need and what ``backends.server.serve_in_thread`` (a fresh free port per call)
does not offer.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple

import httpx
import uvicorn

from backends.local import Engine, EngineConfig
from backends.server import ServerLimits, create_app
from backends.server.debug import HINTS_ROUTE, INTEGRITY_ROUTE

__all__ = ["Live", "ThreadServer", "live_server", "tiny_engine", "wait_idle", "integrity", "hint_summary", "BUSY_KEYS"]

DEVICE_TOKENS = 4096
HOST_TOKENS = 8192
BUSY_KEYS = ("device_held", "running", "waiting", "loads_in_flight")


def tiny_engine(*, load_copy: Any = None, **config: Any) -> Engine:
    """The tiny-random engine; ``config`` overrides EngineConfig fields, ``load_copy`` is the engine's
    copy-fault seam."""
    settings = {"model": "tiny-random", "device_tokens": DEVICE_TOKENS, "host_tokens": HOST_TOKENS, **config}
    return Engine(EngineConfig(**settings), load_copy=load_copy)


class ThreadServer:
    """uvicorn in a daemon thread on 127.0.0.1:``port`` (0: a free one, kept across restarts)."""

    def __init__(self, app: Any, port: int = 0) -> None:
        self.app = app
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"test-server-{self.port}")
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise RuntimeError(f"test server on port {self.port} did not start")
            time.sleep(0.01)
        self._server, self._thread, self._sock = server, thread, sock

    def kill(self, *, graceful: bool = False) -> None:
        """Stop at once: stop listening, drop connections, do not wait for requests in flight (with
        ``graceful``, let them finish and run the app's shutdown normally)."""
        server, thread, sock = self._server, self._thread, self._sock
        if server is None:
            return
        server.should_exit = True
        server.force_exit = not graceful
        if thread is not None:
            thread.join(timeout=30)
        if sock is not None:
            sock.close()
        self._server = self._thread = self._sock = None


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
