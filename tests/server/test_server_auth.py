"""``--api-key``: every route but /health refuses a missing or wrong key with a 401 JSON error, before
reading the body; the right key (as a Bearer token or X-API-Key) is let through."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from server_helpers import Served, start_server

KEY = "s3cret-key"
PROTECTED = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
    ("GET", "/kvflow/v1/info", None),
    ("POST", "/kvflow/v1/steps", {"workflow_id": "w", "steps": {"a": 1}}),
    ("GET", "/kvflow/v1/stats", None),
    ("GET", "/metrics", None),
]


@pytest.fixture(scope="module")
def keyed() -> Iterator[Served]:
    with start_server(api_key=KEY) as s:
        yield s


@pytest.mark.parametrize("method, path, body", PROTECTED, ids=[p for _, p, _ in PROTECTED])
def test_route_needs_the_key(keyed: Served, method: str, path: str, body: dict | None) -> None:
    with httpx.Client(base_url=keyed.url, timeout=60) as c:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"authorization": KEY}):
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["type"] == "authentication_error"
        for headers in ({"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 200, (headers, r.text)


def test_health_is_open_and_unauthenticated_requests_never_reach_the_engine(keyed: Served) -> None:
    before = len(keyed.requests), len(keyed.steps)
    with httpx.Client(base_url=keyed.url, timeout=60) as c:
        assert c.get("/health").json() == {"status": "ok"}
        # An oversized body is refused for the key, not parsed (401, not 413).
        r = c.post("/v1/chat/completions", content=b"x" * (8 * 1024 * 1024))
        assert r.status_code == 401
        c.post("/kvflow/v1/steps", json={"workflow_id": "w"})
        c.post("/v1/chat/completions", json=PROTECTED[1][2])
    assert (len(keyed.requests), len(keyed.steps)) == before
