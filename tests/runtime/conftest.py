from __future__ import annotations

import socket

import pytest

from recording_server import Behaviour, RecordingServer


@pytest.fixture
def server():
    srv = RecordingServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def plain_server():
    """An OpenAI-compatible server with no kvflow routes (the fallback path)."""
    srv = RecordingServer(Behaviour(kvflow=False)).start()
    yield srv
    srv.stop()


@pytest.fixture
def dead_url() -> str:
    """A URL on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
