"""An instrumented LangGraph app behind a real smg whose only worker goes away for a few seconds:
the transport sends the cut calls again (the OpenAI SDK's own retries are off) and the run ends as
one without the outage."""

from __future__ import annotations

import logging
import threading
from contextlib import ExitStack

import pytest

from backends.local import Engine, EngineConfig
from backends.server import create_app, serve_in_thread
from kvflow_orch.harness.cluster import HOST, free_port
from kvflow_orch.langgraph import handler_of, instrument
from scaleout_helpers import smg_gateway

from lg_apps import software_company

OUTAGE_S = 3.0  # longer than smg's health check (1 s): the gateway answers 503 no_available_workers


def _engine() -> Engine:
    return Engine(EngineConfig.build(model="tiny-random", device_tokens=4096, host_tokens=0))


def test_the_transport_retries_calls_the_gateway_could_not_place(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    worker = f"http://{HOST}:{port}"
    later = _engine()  # built before the outage, so the worker comes back in a moment
    with ExitStack() as stack:
        first = ExitStack()
        first.enter_context(serve_in_thread(create_app(_engine()), port=port))
        gateway = stack.enter_context(smg_gateway([worker]))
        app = instrument(software_company(gateway, model="tiny-random", max_tokens=2), namespace="outage",
                         backend_url=gateway, workers=[worker], routing="workflow")
        calm = app.invoke({"run": "calm"}, {"metadata": {"kvflow_workflow_id": "calm"}})
        first.close()  # the worker is gone: connections refused, then smg marks it unhealthy
        stack.callback(handler_of(app).backend.flush)
        again = ExitStack()
        stack.callback(again.close)
        threading.Timer(OUTAGE_S, lambda: again.enter_context(serve_in_thread(create_app(later), port=port))).start()
        with caplog.at_level(logging.INFO, logger="kvflow.runtime"):
            stormy = app.invoke({"run": "calm"}, {"metadata": {"kvflow_workflow_id": "stormy"}})
    retries = [r.getMessage() for r in caplog.records if "; retry " in r.getMessage()]
    cut = f"POST {gateway}/v1/chat/completions failed (HTTP 50"
    assert retries and all(r.startswith(cut) for r in retries), retries
    assert stormy == calm
    print(f"\nworker away {OUTAGE_S} s: the transport retried {len(retries)} times")
