"""What a web page the user opens can make the server do: nothing.

* A browser sends a *simple* request (``text/plain``, form or multipart body) to any address without
  asking first: every POST route the app registers answers it 415 and nothing reaches the engine.
* No GET changes state: ``GET /flush_cache`` is 405 and the cache stays.
* ``kvflow serve`` on loopback (its default) answers only Host names of this machine (a page whose
  domain was re-pointed at 127.0.0.1, DNS rebinding, names its own) and refuses requests carrying
  another host's ``Origin``; ``--allowed-hosts`` changes the list.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

import httpx
import pytest

from backends.base import GenerateRequest
from backends.server import create_app, serve_in_thread
from kvflow_live import tiny_engine
from kvflow_orch.protocol import StepsUpdate
from test_exposure import registered_routes

NOT_JSON = [
    ("text/plain", b'{"workflow_id": "w", "done": true}'),
    ("text/plain;charset=UTF-8", b'{"prompt": "hi", "max_tokens": 1}'),
    ("application/x-www-form-urlencoded", b"workflow_id=w&done=true"),
    ("multipart/form-data; boundary=b", b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n{}\r\n--b--\r\n'),
    (None, b'{"workflow_id": "w", "done": true}'),  # a body without any Content-Type
]


@pytest.fixture(scope="module")
def observed() -> Iterator[tuple[str, Any, list[tuple[str, GenerateRequest]], list[StepsUpdate]]]:
    requests: list[tuple[str, GenerateRequest]] = []
    steps: list[StepsUpdate] = []
    app = create_app(tiny_engine(), debug_routes=True, on_request=lambda route, req: requests.append((route, req)),
                     on_steps=steps.append)
    with serve_in_thread(app) as running:
        yield running.url, app, requests, steps


def _warm(client: httpx.Client) -> int:
    """Cache a prompt; return the device tokens the cache holds."""
    body = {"prompt": "cache me " * 10, "max_tokens": 2, "temperature": 0}
    assert client.post("/v1/completions", json=body).status_code == 200
    used = client.get("/kvflow/v1/stats").json()["device_used"]
    assert used > 0
    return used


def test_every_post_route_refuses_bodies_that_are_not_json(observed) -> None:
    url, app, requests, steps = observed
    posts = sorted({path for method, path in registered_routes(app) if method == "POST"})
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate", "/kvflow/v1/steps",
            "/flush_cache"} <= set(posts)
    with httpx.Client(base_url=url, timeout=60) as client:
        used = _warm(client)
        seen = len(requests), len(steps)
        for path in posts:
            for content_type, body in NOT_JSON:
                headers = {} if content_type is None else {"content-type": content_type}
                r = client.post(path, content=body, headers=headers)
                assert r.status_code == 415, (path, content_type, r.status_code, r.text)
                error = r.json()["error"]
                assert error["code"] == "unsupported_media_type" and error["param"] == "Content-Type"
                assert "application/json" in error["message"]
        assert (len(requests), len(steps)) == seen  # nothing reached the engine or the hint table
        assert client.get("/kvflow/v1/stats").json()["device_used"] == used  # /flush_cache did not flush
        # JSON, with or without parameters, still gets in.
        r = client.post("/kvflow/v1/steps", content=b'{"workflow_id": "w", "steps": {"a": 1}}',
                        headers={"content-type": "application/json; charset=utf-8"})
        assert r.status_code == 200 and len(steps) == seen[1] + 1


def test_no_get_changes_state_flush_cache_is_post_only(observed) -> None:
    url, *_ = observed
    with httpx.Client(base_url=url, timeout=60) as client:
        used = _warm(client)
        r = client.get("/flush_cache")
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert client.get("/kvflow/v1/stats").json()["device_used"] == used
        r = client.post("/flush_cache")  # bodiless, without a Content-Type: what a gateway fans out
        assert r.status_code == 200 and r.json()["freed_device_tokens"] == used
        assert client.get("/kvflow/v1/stats").json()["device_used"] == 0


# ---- kvflow serve, as a user starts it --------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kvflow_serve(*flags: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", "tiny-random", "--device-tokens", "1024",
           "--host-tokens", "0", "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read() if proc.stdout else "kvflow serve exited")
        try:
            httpx.get(f"{url}/health", timeout=1)  # any answer (403 for a Host not allowed) means it is up
            return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("kvflow serve did not come up")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


STEPS = {"workflow_id": "w", "steps": {"a": 1}}


def _refused(r: httpx.Response, what: str) -> None:
    assert r.status_code == 403, (what, r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == "forbidden_host" and what in error["message"] and "--allowed-hosts" in error["message"]


def test_kvflow_serve_on_loopback_refuses_rebound_names_and_foreign_pages() -> None:
    proc, url = _kvflow_serve()
    port = url.rsplit(":", 1)[1]
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
                assert client.get("/v1/models", headers={"host": host}).status_code == 200, host
            # DNS rebinding: the page's own name reaches 127.0.0.1, but the Host header still carries it.
            for route in ("/health", "/v1/models", "/kvflow/v1/stats"):
                _refused(client.get(route, headers={"host": f"attacker.example:{port}"}), "attacker.example")
            _refused(client.post("/kvflow/v1/steps", json=STEPS, headers={"host": "rebound.test"}), "rebound.test")
            # A page elsewhere (or a sandboxed one, Origin: null) sending a request the browser lets through.
            for origin in ("https://attacker.example", "http://127.0.0.1.attacker.example", "null"):
                _refused(client.post("/kvflow/v1/steps", json=STEPS, headers={"origin": origin}), origin)
                _refused(client.post("/flush_cache", headers={"origin": origin}), origin)
            # A page served from this machine may call it (the browser still enforces CORS on JSON).
            r = client.post("/kvflow/v1/steps", json=STEPS, headers={"origin": "http://localhost:5173"})
            assert r.status_code == 200
    finally:
        _stop(proc)


def test_allowed_hosts_names_the_hosts_a_server_answers() -> None:
    proc, url = _kvflow_serve("--allowed-hosts", "kvflow.internal")
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/v1/models", headers={"host": "kvflow.internal:8000"}).status_code == 200
            r = client.post("/kvflow/v1/steps", json=STEPS,
                            headers={"host": "kvflow.internal", "origin": "https://kvflow.internal"})
            assert r.status_code == 200
            _refused(client.get("/v1/models"), "127.0.0.1")  # the loopback names are no longer implied
    finally:
        _stop(proc)
    proc, url = _kvflow_serve("--allowed-hosts", "*")
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/v1/models", headers={"host": "any.name"}).status_code == 200
            # Any Host, but a foreign page is still refused: only the server's own host may be the Origin.
            _refused(client.post("/kvflow/v1/steps", json=STEPS, headers={"origin": "https://attacker.example"}),
                     "attacker.example")
    finally:
        _stop(proc)


@pytest.mark.parametrize("value", ["", "a,,b", "*,localhost"])
def test_bad_allowed_hosts_is_an_argument_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kvflow_orch import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--model", "tiny-random", "--allowed-hosts", value])
    assert exited.value.code == 2
    assert "--allowed-hosts: must be host names separated by commas" in capsys.readouterr().err
