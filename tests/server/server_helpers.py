"""Start the real server on the tiny-random engine, and check that the KV pools hold nothing for
finished requests (the leak check)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple

import httpx

from backends.base import GenerateRequest
from backends.local import Engine, EngineConfig
from backends.server import ServerLimits, create_app, serve_in_thread
from kvflow_orch.protocol import StepsUpdate

DEVICE_TOKENS = 1024
HOST_TOKENS = 2048


class Served(NamedTuple):
    url: str
    requests: list[tuple[str, GenerateRequest]]
    """Every request the server handed to the engine, with its route (the ``on_request`` observer)."""
    steps: list[StepsUpdate]


@contextmanager
def start_server(*, api_key: str | None = None, limits: ServerLimits | None = None,
                 allowed_hosts: tuple[str, ...] | None = None, **config: Any) -> Iterator[Served]:
    settings = {"model": "tiny-random", "device_tokens": DEVICE_TOKENS, "host_tokens": HOST_TOKENS, **config}
    engine = Engine(EngineConfig.build(**settings))
    requests: list[tuple[str, GenerateRequest]] = []
    steps: list[StepsUpdate] = []
    app = create_app(engine, api_key=api_key, limits=limits, allowed_hosts=allowed_hosts,
                     on_request=lambda route, req: requests.append((route, req)), on_steps=steps.append)
    with serve_in_thread(app) as running:
        yield Served(running.url, requests, steps)


BUSY_KEYS = ("device_held", "running", "waiting")


def busy(stats: dict[str, Any]) -> dict[str, int]:
    """What requests still hold: device slots handed out but not returned to the cache, and requests
    running or queued. All zero once every request has ended (finished, failed or cancelled); cached
    prefixes are not counted, they belong to the cache, not to a request."""
    return {key: int(stats[key]) for key in BUSY_KEYS}


def assert_no_leak(client: httpx.Client, timeout_s: float = 10.0) -> None:
    """The server still answers, and once cancellations have settled no slot is held by a request."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = client.get("/kvflow/v1/stats").json()
        held = busy(stats)
        if not any(held.values()):
            assert stats["device_used"] <= stats["device_total"]
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"still held after {timeout_s} s: {held} (stats: {stats})")
        time.sleep(0.05)
