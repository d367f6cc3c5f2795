"""The hint goes where the server's /kvflow/v1/info says, over real HTTP on 127.0.0.1: a server
preferring ``kv_transfer_params.kvflow`` (the vLLM backend's info) gets every hint of a run there
and none in ``custom_params``; one through a gateway too (the worker's info decides); a server
naming only locations this client does not know is a BackendError naming both lists, and gets no
chat request at all."""

from __future__ import annotations

import asyncio

import pytest
from recording_server import Behaviour, RecordingServer
from runtime_graphs import LOOP_HINTS, review_loop

from kvflow_orch.clients import BackendError, GatewayClient, GatewayConfig, HttpClient
from kvflow_orch.protocol import CUSTOM_PARAMS, KV_TRANSFER_PARAMS, KVFlowHint, Sampling
from kvflow_orch.runtime import run

VLLM_HINTS = [KV_TRANSFER_PARAMS, CUSTOM_PARAMS]  # what backends/vllm_kvflow's info names
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "say hi"}]
HINT = KVFlowHint(workflow_id="w1", agent="pm", steps={"pm": 0}, fixed_prefix=1)


@pytest.fixture
def started():
    servers: list[RecordingServer] = []

    def start(**behaviour) -> RecordingServer:
        servers.append(RecordingServer(Behaviour(**behaviour)).start())
        return servers[-1]

    yield start
    for srv in servers:
        srv.stop()


def test_a_run_puts_every_hint_where_the_server_prefers(started) -> None:
    server = started(hints=VLLM_HINTS)
    run(review_loop(), {"idea": "todo app"}, backend=server.url, workflow_id="wf-kv", namespace="app")
    hints = server.hints(KV_TRANSFER_PARAMS)
    assert [(h["agent"], h["steps"]) for h in hints] == LOOP_HINTS
    assert all(h["workflow_id"] == "wf-kv" and h["fixed_prefix"] == 1 for h in hints)
    assert all("custom_params" not in body for body in server.chats())


def test_an_info_without_hints_gets_custom_params(started) -> None:
    server = started()  # an older server: its info has no "hints"
    client = HttpClient(server.url)
    asyncio.run(client.chat(MESSAGES, Sampling(max_tokens=2), HINT))
    assert client.hint_location == CUSTOM_PARAMS
    assert server.hints(CUSTOM_PARAMS) == [HINT.model_dump(mode="json")]
    assert server.hints(KV_TRANSFER_PARAMS) == [None]


def test_only_unknown_locations_is_an_error_naming_both_lists(started) -> None:
    server = started(hints=["headers.x-kvflow"])
    client = HttpClient(server.url)
    with pytest.raises(BackendError) as caught:
        asyncio.run(client.chat(MESSAGES, Sampling(max_tokens=2), HINT))
    message = str(caught.value)
    assert server.url in message and "[headers.x-kvflow]" in message
    assert CUSTOM_PARAMS in message and KV_TRANSFER_PARAMS in message
    assert server.chats() == []  # never a request that silently carries no hint


def test_through_a_gateway_the_workers_info_decides(started) -> None:
    worker = started(hints=VLLM_HINTS)
    gateway = started(kvflow=False)  # answers chats; its own /kvflow/v1/info is a 404, as smg's
    client = GatewayClient(gateway.url, [worker.url], GatewayConfig(retries=0))

    async def go() -> None:
        await client.chat(MESSAGES, Sampling(max_tokens=2), HINT)
        await client.aclose()

    asyncio.run(go())
    assert client.hint_location == KV_TRANSFER_PARAMS
    assert gateway.hints(KV_TRANSFER_PARAMS) == [HINT.model_dump(mode="json")]
    assert "custom_params" not in gateway.chats()[0]
