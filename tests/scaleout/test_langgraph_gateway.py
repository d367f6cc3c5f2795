"""An instrumented LangGraph app through a real smg in front of three tiny-random workers: hints
arrive unchanged at the workers, the routing header groups calls, steps reach the workers that
served the workflow and ``done`` every worker."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import pytest

from kvflow_orch.langgraph import PlainServerWarning, handler_of, instrument
from scaleout_helpers import Gateway

from lg_apps import EXPECTED, software_company


def _calls(gateway: Gateway, workflow_id: str) -> dict[str, list]:
    """Worker URL -> the hints of the workflow's calls it served."""
    return {w.url: [h for h in w.hints if h.workflow_id == workflow_id] for w in gateway.workers}


def _steps(gateway: Gateway, workflow_id: str) -> dict[str, list]:
    return {w.url: [u for u in w.steps if u.workflow_id == workflow_id] for w in gateway.workers}


def _wire(steps: dict) -> tuple:
    """Steps as ``lg_apps.EXPECTED`` writes them (``None``: not expected again), order-free."""
    return tuple(sorted((agent, None if value is None or math.isinf(value) else value)
                        for agent, value in steps.items()))


def test_workflow_routing_keeps_a_workflow_on_one_worker_with_its_hints_unchanged(gateway: Gateway) -> None:
    app = instrument(software_company(gateway.url, model="tiny-random", max_tokens=2), namespace="shop",
                     backend_url=gateway.url, workers=[w.url + "/" for w in gateway.workers], routing="workflow")
    app.invoke({"run": "lg-wf"}, {"metadata": {"kvflow_workflow_id": "lg-wf"}})
    handler_of(app).backend.flush()
    calls = _calls(gateway, "lg-wf")
    served = [url for url, hints in calls.items() if hints]
    assert len(served) == 1  # the routing key <namespace>/<workflow_id> is sticky
    hints = calls[served[0]]
    assert Counter((h.agent, _wire(h.steps)) for h in hints) == Counter((a, _wire(s)) for a, s in EXPECTED)
    assert all(h.namespace == "shop" and h.fixed_prefix == 1 for h in hints)
    steps = _steps(gateway, "lg-wf")
    assert any(not u.done for u in steps[served[0]])  # the qa router's choices reached the serving worker
    for url, updates in steps.items():
        assert updates and updates[-1].done, f"done did not reach {url}"
        if url != served[0]:
            assert all(u.done for u in updates), f"{url} served nothing of the workflow yet got its steps"


def test_discovered_workers_and_agent_routing_from_an_async_app(gateway: Gateway) -> None:
    app = instrument(software_company(gateway.url, use_async=True, model="tiny-random", max_tokens=2),
                     namespace="shop", backend_url="smg+" + gateway.url)
    assert handler_of(app).backend.routing == "agent"

    async def go() -> None:
        await asyncio.gather(*(app.ainvoke({"run": f"lg-a{i}"}, {"metadata": {"kvflow_workflow_id": f"lg-a{i}"}})
                               for i in range(3)))

    asyncio.run(go())
    handler_of(app).backend.flush()
    assert sorted(handler_of(app).backend.router.workers) == sorted(w.url for w in gateway.workers)
    for agent in ("pm", "fe", "be", "engineer", "qa"):  # the routing key <namespace>/<agent> is sticky
        on = {url for i in range(3) for url, hints in _calls(gateway, f"lg-a{i}").items()
              if any(h.agent == agent for h in hints)}
        assert len(on) == 1, f"agent {agent} was served by {on}"
    live_updates_at_servers = 0
    for i in range(3):
        served = {url for url, hints in _calls(gateway, f"lg-a{i}").items() if hints}
        for url, updates in _steps(gateway, f"lg-a{i}").items():
            assert updates and updates[-1].done, f"done of lg-a{i} did not reach {url}"
            if url not in served:
                assert all(u.done for u in updates)
        live_updates_at_servers += sum(not u.done for url in served for u in _steps(gateway, f"lg-a{i}")[url])
    # Outboxes coalesce: on a loaded machine one workflow's live updates can all be replaced by its
    # done while a worker's previous request is in flight, so ask it of the three runs together.
    assert live_updates_at_servers > 0


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"backend_url": "http://127.0.0.1:1", "routing": "agent"}, "routing= needs a gateway"),
        ({"backend_url": "http://127.0.0.1:1", "workers": "http://127.0.0.1:2"}, "workers must be a list"),
        ({"backend_url": "smg+http://127.0.0.1:1", "workers": ["http://127.0.0.1:2"]}, "not both"),
        ({"backend_url": "smg+http://127.0.0.1:1", "routing": "round-robin"}, "routing must be"),
        ({"workers": ["http://127.0.0.1:2"]}, "workers= needs a gateway"),
    ],
)
def test_gateway_options_are_checked(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        instrument(software_company("http://127.0.0.1:1"), **kwargs)


def test_a_gateway_without_kvflow_workers_sends_plain_requests_and_says_why(gateway: Gateway) -> None:
    app = instrument(software_company(gateway.url, model="tiny-random", max_tokens=2),
                     backend_url=gateway.url, workers=["http://127.0.0.1:9"])  # nothing listens there
    with pytest.warns(PlainServerWarning, match=r"none of whose workers \(http://127.0.0.1:9\) answers"):
        app.invoke({"run": "lg-plain"}, {"metadata": {"kvflow_workflow_id": "lg-plain"}})
    assert not any(_calls(gateway, "lg-plain").values()) and not any(_steps(gateway, "lg-plain").values())
