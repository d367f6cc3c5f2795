"""Through a real smg: the worker registers with its model name, hints reach the worker unchanged,
the routing header is sticky, steps go to the workers that serve a workflow and done to all."""

from __future__ import annotations

import asyncio
import math

import httpx

from kvflow_orch import END, START, Workflow, arun
from kvflow_orch.clients import GatewayClient, GatewayConfig, StepsRouter
from kvflow_orch.clients.gateway import ROUTING_HEADER, WORKER_HEADER
from kvflow_orch.protocol import KVFlowHint, StepsUpdate, attach_hint
from scaleout_helpers import Gateway, wait_for


def _three_agents() -> Workflow:
    """planner -> writer -> a tool (a function node: the runtime sends a steps update) -> checker."""
    wf = Workflow("trio")
    for name in ("planner", "writer", "checker"):
        wf.add_agent(name, f"You are the {name}. " * 20, "Task: {task}", output=name, max_tokens=2)
    wf.add_node("tool", lambda state: {"task": state["task"] + "!"})
    wf.add_edge(START, "planner")
    wf.add_edge("planner", "writer")
    wf.add_edge("writer", "tool")
    wf.add_edge("tool", "checker")
    wf.add_edge("checker", END)
    return wf


def _by_url(gateway: Gateway, url: str):
    return next(w for w in gateway.workers if w.url == url.rstrip("/"))


def test_smg_registers_each_worker_under_its_model_name(gateway: Gateway) -> None:
    listed = httpx.get(gateway.url + "/workers").json()["workers"]
    assert sorted(w["url"] for w in listed) == sorted(w.url for w in gateway.workers)
    assert {w["model_id"] for w in listed} == {"tiny-random"}
    assert [m["id"] for m in httpx.get(gateway.url + "/v1/models").json()["data"]] == ["tiny-random"]


def test_hint_arrives_unchanged_and_the_routing_key_is_sticky(gateway: Gateway) -> None:
    hint = KVFlowHint(workflow_id="wf-sticky", namespace="team", agent="coder",
                      steps={"coder": 0.0, "qa": 1.0, "pm": math.inf}, fixed_prefix=1)
    body = attach_hint({"model": "tiny-random", "max_tokens": 2, "temperature": 0,
                        "messages": [{"role": "system", "content": "fixed"}, {"role": "user", "content": "go"}]}, hint)
    served = set()
    for _ in range(3):
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers={ROUTING_HEADER: "team/coder"},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        served.add(answer.headers[WORKER_HEADER])
    assert len(served) == 1
    worker = _by_url(gateway, served.pop())
    assert worker.hints[-3:] == [hint] * 3


def test_steps_reach_the_serving_worker_and_done_reaches_every_worker(gateway: Gateway) -> None:
    client = GatewayClient(gateway.url, [w.url for w in gateway.workers], GatewayConfig(routing="workflow"))

    async def go() -> None:
        await arun(_three_agents(), {"task": "t"}, backend=client, workflow_id="wf-steps", namespace="team")
        await client.aclose()

    asyncio.run(go())
    serving = [w for w in gateway.workers if any(h.workflow_id == "wf-steps" for h in w.hints)]
    assert len(serving) == 1  # one routing key per workflow: one worker
    for worker in gateway.workers:
        wait_for(lambda worker=worker: any(u.done and u.workflow_id == "wf-steps" for u in worker.steps), 10,
                 f"done at {worker.url}")
        live = [u for u in worker.steps if u.workflow_id == "wf-steps" and not u.done]
        assert bool(live) == (worker is serving[0])  # steps only where the workflow runs


def test_a_worker_serving_a_workflow_first_gets_its_current_steps(gateway: Gateway) -> None:
    first, second = gateway.workers[0], gateway.workers[1]
    update = StepsUpdate(workflow_id="wf-new", namespace="team", steps={"qa": 0.0, "coder": 2.0})

    async def go() -> None:
        router = StepsRouter([w.url for w in gateway.workers])
        router.served_by("team", "wf-new", first.url)
        router.send(update)
        await router.flush()
        assert [u for u in second.steps if u.workflow_id == "wf-new"] == []
        router.served_by("team", "wf-new", second.url)  # e.g. the gateway rerouted after a loss
        await router.flush()
        router.send(StepsUpdate(workflow_id="wf-new", namespace="team", done=True))
        await router.flush()
        await router.aclose()

    asyncio.run(go())
    for worker in (first, second):
        received = [u for u in worker.steps if u.workflow_id == "wf-new"]
        assert received[0] == update and received[-1].done
    assert [u.done for u in gateway.workers[2].steps if u.workflow_id == "wf-new"] == [True]


def test_workers_are_discovered_from_the_gateway_and_agent_keys_group_calls(gateway: Gateway) -> None:
    client = GatewayClient(gateway.url)  # routing="agent", the default

    async def go() -> None:
        for i in range(3):
            await arun(_three_agents(), {"task": str(i)}, backend=client, workflow_id=f"wf-agent{i}", namespace="ns2")
        await client.aclose()

    asyncio.run(go())
    assert sorted(client.workers) == sorted(w.url for w in gateway.workers)
    for agent in ("planner", "writer", "checker"):
        holders = [w for w in gateway.workers if any(h.namespace == "ns2" and h.agent == agent for h in w.hints)]
        assert len(holders) == 1, f"{agent} ran on {len(holders)} workers"


def test_without_hints_nothing_kvflow_reaches_the_workers(gateway: Gateway) -> None:
    client = GatewayClient(gateway.url, config=GatewayConfig(hints=False, routing="none"))

    async def go() -> None:
        await arun(_three_agents(), {"task": "x"}, backend=client, workflow_id="wf-plain", namespace="ns3")
        await client.aclose()

    asyncio.run(go())
    assert not any(h.workflow_id == "wf-plain" for w in gateway.workers for h in w.hints)
    assert not any(u.workflow_id == "wf-plain" for w in gateway.workers for u in w.steps)
