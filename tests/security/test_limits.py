"""Size limits a client cannot get around: request bodies (413, declared or chunked, on every POST
route), hint sizes at their exact boundaries (one past them: 422 on the steps route, 400 in a
request body), and the memory bounds of the hint table and of the metrics' label sets.

tests/server covers the everyday bad-input cases; these pin the boundaries and the bypass attempts."""

from __future__ import annotations

import socket
from typing import Iterator

import httpx
import pytest

from backends.kvcache import HintTable
from backends.server import ServerLimits
from kvflow_live import Live, hint_summary, live_server, wait_idle
from kvflow_orch.protocol import MAX_AGENTS, MAX_NAME_LEN

BODY_LIMIT = 256 * 1024
POST_ROUTES = ("/v1/chat/completions", "/v1/completions", "/generate", "/kvflow/v1/steps")


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with live_server(limits=ServerLimits(max_body_bytes=BODY_LIMIT)) as served:
        yield served


@pytest.fixture
def client(live: Live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


def _error(response: httpx.Response, status: int, needle: str) -> None:
    assert response.status_code == status, response.text
    assert needle in response.json()["error"]["message"], response.text


@pytest.mark.parametrize("route", POST_ROUTES)
def test_oversized_body_is_413_whether_declared_or_streamed(client: httpx.Client, route: str) -> None:
    big = b'{"pad": "' + b"x" * BODY_LIMIT + b'"}'
    _error(client.post(route, content=big, headers={"content-type": "application/json"}), 413, "limit")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server must count what arrives
        for i in range(0, len(big), 16 * 1024):
            yield big[i:i + 16 * 1024]

    _error(client.post(route, content=chunks(), headers={"content-type": "application/json"}), 413, "limit")
    wait_idle(client)


def test_steps_map_and_names_at_their_limits(client: httpx.Client) -> None:
    at_limit = {f"agent-{i}": i % 5 for i in range(MAX_AGENTS)}
    ok = client.post("/kvflow/v1/steps", json={"workflow_id": "w-max", "steps": at_limit})
    assert ok.status_code == 200, ok.text
    over = {**at_limit, "one-too-many": 0}
    _error(client.post("/kvflow/v1/steps", json={"workflow_id": "w-over", "steps": over}), 422, str(MAX_AGENTS))
    name = "n" * MAX_NAME_LEN
    body = {"workflow_id": name, "namespace": name, "steps": {name: 1}}
    assert client.post("/kvflow/v1/steps", json=body).status_code == 200
    for field in ("workflow_id", "namespace"):
        body = {"workflow_id": "w", field: "n" * (MAX_NAME_LEN + 1)}
        _error(client.post("/kvflow/v1/steps", json=body), 422, field)
    hint = {"workflow_id": "w", "agent": "a" * (MAX_NAME_LEN + 1), "steps": {}}
    body = {"messages": [{"role": "user", "content": "hi"}], "custom_params": {"kvflow": hint}}
    _error(client.post("/v1/chat/completions", json=body), 400, "agent")
    summary = hint_summary(client)
    assert summary["workflows"] == 2 and summary["entries"] == MAX_AGENTS + 1  # the rejected ones left nothing
    for wf in ("w-max", name):
        client.post("/kvflow/v1/steps", json={"workflow_id": wf, "namespace": "default" if wf == "w-max" else name,
                                              "done": True}).raise_for_status()
    assert hint_summary(client)["entries"] == 0


def test_hint_table_memory_is_bounded_in_entries_not_only_workflows() -> None:
    # Regression: the table bounded the number of workflows (16,384) but not their maps, so one client
    # could hold 16,384 x 4,096 long agent names (tens of GB). Now the oldest workflows go first.
    table = HintTable(max_entries=3 * MAX_AGENTS)
    for w in range(10):
        table.set_steps("tenant", f"wf-{w}", {f"{w}-{'x' * 200}-{i}": 1 for i in range(MAX_AGENTS)})
        assert table.entry_count <= table.max_entries
    assert table.workflow_count == 3 and table.entry_count == 3 * MAX_AGENTS
    assert table.raw_steps(("tenant", f"9-{'x' * 200}-0")) == 1  # the newest is kept
    assert table.raw_steps(("tenant", f"0-{'x' * 200}-0")) == float("inf")  # the oldest is gone
    table.forget("tenant", "wf-9")
    assert table.entry_count == 2 * MAX_AGENTS


def test_metrics_labels_stay_bounded_whatever_methods_and_paths_clients_send(live: Live, client: httpx.Client) -> None:
    # Regression: the method label was taken from the request as is, so every made-up method a client
    # sent added three /metrics series forever (300 methods -> 900 lines).
    host, port = live.url.removeprefix("http://").split(":")
    lines_before = len(client.get("/metrics").text.splitlines())
    for i in range(40):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"BOGUS{i} /made-up/{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 4")
    text = client.get("/metrics").text
    assert "BOGUS" not in text and "made-up" not in text
    assert len(text.splitlines()) <= lines_before + 6  # at most one new (method="other", path="other") family
