"""The LangGraph transport puts the hint where the server's /kvflow/v1/info says (real HTTP on
127.0.0.1): ``kv_transfer_params.kvflow`` for a server preferring it (the vLLM backend's info),
sync and async; a server naming only unknown locations fails the LLM call with that reason."""

from __future__ import annotations

import asyncio

import pytest
from lg_apps import EXPECTED, in_call_order, software_company
from recording_server import Behaviour, RecordingServer

from kvflow_orch.langgraph import handler_of, instrument
from kvflow_orch.protocol import CUSTOM_PARAMS, KV_TRANSFER_PARAMS, HintLocationError


@pytest.fixture
def vllm_like():
    srv = RecordingServer(Behaviour(hints=[KV_TRANSFER_PARAMS, CUSTOM_PARAMS])).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_hints_go_to_kv_transfer_params_when_the_server_prefers_it(vllm_like, strict_tracking, use_async) -> None:
    app = instrument(software_company(vllm_like.url, use_async=use_async), namespace="shop", backend_url=vllm_like.url)
    config = {"metadata": {"kvflow_workflow_id": "wf-kv"}}
    if use_async:
        asyncio.run(app.ainvoke({"run": "r"}, config))
    else:
        app.invoke({"run": "r"}, config)
    handler_of(app).backend.close()
    hints = vllm_like.hints(KV_TRANSFER_PARAMS)
    assert all(h is not None and h["workflow_id"] == "wf-kv" and h["fixed_prefix"] == 1 for h in hints)
    assert in_call_order([(h["agent"], h["steps"]) for h in hints]) == EXPECTED
    assert all("custom_params" not in body for body in vllm_like.chats())
    assert handler_of(app).backend.hint_location(vllm_like.url + "/v1/chat/completions") == KV_TRANSFER_PARAMS


def test_a_server_naming_only_unknown_locations_fails_the_call_with_the_reason() -> None:
    srv = RecordingServer(Behaviour(hints=["headers.x-kvflow"])).start()
    try:
        app = instrument(software_company(srv.url), namespace="shop", backend_url=srv.url)
        with pytest.raises(HintLocationError) as caught:  # the LLM client lets it through as is
            app.invoke({"run": "r"})
        reason = str(caught.value)
        assert "[headers.x-kvflow]" in reason and KV_TRANSFER_PARAMS in reason and srv.url in reason
        assert srv.chats() == []
        handler_of(app).backend.close()
    finally:
        srv.stop()
