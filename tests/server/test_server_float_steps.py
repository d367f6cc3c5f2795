"""The embedded server takes fractional (expected) steps in hints and steps updates, keeps them as
floats up to the engine, and still rejects negative or non-numeric ones."""

from __future__ import annotations

import httpx
import pytest

from kvflow_orch.protocol import KVFlowHint, attach_hint
from server_helpers import Served

MESSAGES = [{"role": "system", "content": "You are the supervisor."}, {"role": "user", "content": "Route."}]


def test_hint_with_fractional_steps_reaches_the_engine(client: httpx.Client, served: Served) -> None:
    hint = KVFlowHint(workflow_id="wf-f", agent="boss", steps={"boss": 0, "w0": 3.69, "w7": 26.5, "gone": None},
                      fixed_prefix=1)
    body = attach_hint({"messages": MESSAGES, "max_tokens": 2}, hint)
    assert body["custom_params"]["kvflow"]["steps"] == {"boss": 0, "w0": 3.69, "w7": 26.5, "gone": None}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    got = served.requests[-1][1].hint
    assert got.steps == {"boss": 0, "w0": 3.69, "w7": 26.5, "gone": float("inf")}


def test_steps_update_with_fractional_steps(client: httpx.Client, served: Served) -> None:
    update = {"workflow_id": "wf-g", "namespace": "app", "steps": {"a": 1.25, "b": 7, "c": None}}
    r = client.post("/kvflow/v1/steps", json=update)
    assert r.status_code == 200, r.text
    assert served.steps[-1].steps == {"a": 1.25, "b": 7, "c": float("inf")}
    assert client.post("/kvflow/v1/steps", json={**update, "done": True}).status_code == 200


@pytest.mark.parametrize("value", [b"-0.5", b'"1.5"', b"NaN"])
def test_bad_fractional_steps_are_422(client: httpx.Client, value: bytes) -> None:
    body = b'{"workflow_id": "wf-h", "steps": {"a": ' + value + b"}}"
    r = client.post("/kvflow/v1/steps", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "steps" in r.text, r.text
