"""A client that goes away mid-stream or mid-prefill: the engine request is cancelled (it stops
early: the cache holds far fewer tokens than a finished request would have produced), every slot
comes back, the cache stays consistent, and the server keeps answering."""

from __future__ import annotations

import json
import socket
import time
from typing import Iterator

import httpx
import pytest

from kvflow_live import Live, integrity, live_server, wait_idle

PREFILL_TOKENS = 7000
"""With 16-token prefill chunks this prompt takes ~500 scheduler steps (seconds on this CPU), so a
disconnect seen within a few hundred milliseconds lands inside the prefill."""


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with live_server(device_tokens=8192, host_tokens=0, chunk_tokens=16) as served:
        yield served


@pytest.fixture
def client(live: Live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


def _disconnect_status_count(client: httpx.Client, path: str) -> int:
    needle = f'path="{path}",status="499"}}'
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("kvflow_http_requests_total{") and needle in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _assert_still_serving(client: httpx.Client) -> None:
    r = client.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text
    assert len(r.json()["output_ids"]) >= 1


def test_disconnect_mid_stream_cancels_and_frees(client: httpx.Client, live: Live) -> None:
    before = wait_idle(client)
    max_tokens = 6000  # ~15 s of decoding here: a request that was not cancelled would hold them all
    body = {"input_ids": [10, 20, 30, 40], "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0}}
    events = 0
    with client.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                assert "error" not in json.loads(line[6:])
                events += 1
                if events == 3:
                    break  # leaving the block closes the connection mid-stream
    assert events == 3
    after = wait_idle(client, timeout_s=10)
    # The aborted request's computed KV is cached; a finished one would have cached ~6,000 tokens.
    assert after["device_used"] - before["device_used"] < max_tokens // 4, (before, after)
    state = integrity(client)
    assert state == {**state, "ok": True, "locked_nodes": 0}, state
    _assert_still_serving(client)


def _raw_post(url: str, path: str, payload: dict) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(payload).encode()
    sock = socket.create_connection((host, int(port)))
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def test_disconnect_mid_prefill_cancels_and_frees(client: httpx.Client, live: Live) -> None:
    before = wait_idle(client)
    gone_before = _disconnect_status_count(client, "/v1/chat/completions")
    system = "".join(chr(97 + (i * 7) % 26) for i in range(PREFILL_TOKENS))  # byte-level: 1 token per char
    payload = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "go"}],
               "max_tokens": 50, "temperature": 0}
    sock = _raw_post(live.url, "/v1/chat/completions", payload)
    try:
        deadline = time.monotonic() + 20
        while client.get("/kvflow/v1/stats").json()["running"] == 0:  # admitted: its prefill has begun
            assert time.monotonic() < deadline, "the request was never admitted"
            time.sleep(0.02)
    finally:
        sock.close()
    after = wait_idle(client, timeout_s=10)
    # Only the prompt chunks computed before the cancellation are cached: not the whole prompt.
    assert after["device_used"] - before["device_used"] < PREFILL_TOKENS, (before, after)
    assert after["recomputed_tokens"] - before["recomputed_tokens"] >= PREFILL_TOKENS  # it was admitted
    deadline = time.monotonic() + 5
    while _disconnect_status_count(client, "/v1/chat/completions") == gone_before:
        assert time.monotonic() < deadline, "the server did not record the client's disconnect (499)"
        time.sleep(0.05)
    state = integrity(client)
    assert state["ok"] and state["locked_nodes"] == 0, state
    _assert_still_serving(client)
