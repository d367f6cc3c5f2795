"""Run the server app with uvicorn in a background thread on 127.0.0.1 and a free port (or a given one).

For tests and in-process tools that need a real HTTP server: the socket is bound before the thread
starts, so the port is known and never raced for; leaving the context stops the server (running the
app's shutdown, which shuts the engine down when the app manages it). Set ``server.force_exit`` on the
yielded :class:`RunningServer` before leaving to stop at once instead, without waiting for requests
in flight (a crash drill).
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator, NamedTuple

import uvicorn
from starlette.types import ASGIApp

__all__ = ["RunningServer", "serve_in_thread"]


class RunningServer(NamedTuple):
    url: str
    port: int
    server: uvicorn.Server


@contextmanager
def serve_in_thread(app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0,
                    start_timeout_s: float = 60.0) -> Iterator[RunningServer]:
    """``port`` 0 takes a free one; a given port is bound with SO_REUSEADDR (a restart on the same port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"kvflow-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive():
            sock.close()
            raise RuntimeError("the server thread exited during start-up (see the log above)")
        if time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout=30)
            sock.close()
            raise TimeoutError(f"the server did not start within {start_timeout_s} s")
        time.sleep(0.01)
    try:
        yield RunningServer(f"http://{host}:{port}", port, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
