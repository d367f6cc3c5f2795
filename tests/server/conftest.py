"""A real embedded server (tiny-random engine, uvicorn on 127.0.0.1, a free port) shared by the
tests of a module, and an HTTP client for it."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from server_helpers import Served, start_server


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with start_server() as s:
        yield s


@pytest.fixture
def client(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=60) as c:
        yield c

