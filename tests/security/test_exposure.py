"""What the server exposes, and to whom.

* Defaults: ``kvflow serve`` and the in-process server bind 127.0.0.1; the debug routes are absent
  unless asked for. (tests/server/test_serve_cli.py runs the real ``kvflow serve`` and checks its socket.)
* ``--api-key``: every route the app actually registers (enumerated from the app, debug routes
  included, so a route added later cannot be forgotten by a hand-written list), every method, and
  unknown paths answer 401 without the key; only ``/health`` is open.
* No route reveals another namespace's prompts or workflow ids: after two tenants ran with secret
  names and prompts, nothing a third party can GET (info, stats, metrics, models, debug counts, error
  messages) contains any of them.
"""

from __future__ import annotations

import argparse
import inspect
from typing import Iterator

import httpx
import pytest

from kvflow_orch.cli import serve as serve_cli
from backends.server import serve_in_thread
from kvflow_live import Live, live_server, wait_idle

KEY = "k-7f3a9c"


def registered_routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route, looking inside included routers (FastAPI keeps them wrapped)."""
    out = []
    for route in app.routes:
        for inner in getattr(getattr(route, "original_router", None), "routes", [route]):
            for method in sorted(getattr(inner, "methods", None) or ()):
                out.append((method, inner.path))
    return out


@pytest.fixture(scope="module")
def keyed() -> Iterator[Live]:
    with live_server(api_key=KEY, debug_routes=True) as served:
        yield served


def test_defaults_bind_loopback_and_hide_debug_routes() -> None:
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(["--model", "tiny-random"])
    assert args.host == "127.0.0.1" and args.api_key is None and args.debug_routes is False
    assert inspect.signature(serve_in_thread).parameters["host"].default == "127.0.0.1"
    with live_server(debug_routes=False) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        paths = {path for _, path in registered_routes(live.server.app)}
        assert not any(p.startswith("/kvflow/v1/debug") for p in paths), paths
        assert client.get("/kvflow/v1/debug/integrity").status_code == 404


def test_api_key_guards_every_registered_route_but_health(keyed: Live) -> None:
    routes = registered_routes(keyed.server.app)
    paths = {path for _, path in routes}
    assert {"/kvflow/v1/debug/integrity", "/kvflow/v1/steps", "/generate", "/metrics"} <= paths
    probes = routes + [("PUT", "/v1/chat/completions"), ("GET", "/no/such/route"), ("OPTIONS", "/generate")]
    with httpx.Client(base_url=keyed.url, timeout=30) as client:
        for method, path in probes:
            if path == "/health":
                continue
            for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": f"Basic {KEY}"}):
                r = client.request(method, path, headers=headers, json={})
                assert r.status_code == 401, (method, path, headers, r.status_code)
                if method != "HEAD":  # a HEAD answer has no body
                    assert r.json()["error"]["type"] == "authentication_error"
        assert client.get("/health").status_code == 200
        authed = {"authorization": f"Bearer {KEY}"}
        assert client.get("/kvflow/v1/debug/integrity", headers=authed).json()["ok"] is True
        assert client.get("/kvflow/v1/stats", headers=authed).status_code == 200


SECRETS = {"alpha": ("wf-secret-alpha-4711", "agent-alpha-cfo", "The merger target is Zyxwv Corp."),
           "beta": ("wf-secret-beta-0815", "agent-beta-hr", "Salary band for Qwerty Lastname is 9.")}


def test_no_route_reveals_other_namespaces_prompts_or_workflow_ids() -> None:
    with live_server() as live, httpx.Client(base_url=live.url, timeout=60) as client:
        for namespace, (workflow, agent, secret) in SECRETS.items():
            hint = {"workflow_id": workflow, "namespace": namespace, "agent": agent, "steps": {agent: 0}}
            body = {"messages": [{"role": "system", "content": secret}, {"role": "user", "content": secret}],
                    "max_tokens": 3, "custom_params": {"kvflow": hint}}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            client.post("/generate", json={"text": secret, "sampling_params": {
                "max_new_tokens": 2, "custom_params": {"kvflow": hint}}}).raise_for_status()
            client.post("/kvflow/v1/steps", json={"workflow_id": workflow, "namespace": namespace,
                                                  "steps": {agent: 1}}).raise_for_status()
        wait_idle(client)
        seen = []
        for method, path in registered_routes(live.server.app):
            if method == "GET":
                seen.append(client.get(path).text)
        # errors about someone else's workflow must not echo what the server knows about it
        seen.append(client.post("/kvflow/v1/steps", json={"workflow_id": SECRETS["alpha"][0], "steps": {"x": -1}}).text)
        seen.append(client.post("/kvflow/v1/steps", json={"workflow_id": SECRETS["beta"][0], "done": True,
                                                          "namespace": "alpha"}).text)
        leaked = [s for values in SECRETS.values() for s in (*values, "alpha", "beta")
                  if any(s in text for text in seen)]
        assert not leaked, leaked
