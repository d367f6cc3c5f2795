"""pytest plugin: every ``StateGraph.compile()`` in the session returns ``instrument(compiled)``.

Loaded with ``-p langgraph_suite_plugin`` (``.ci`` on ``PYTHONPATH``) by ``.ci/langgraph-suite`` to
run LangGraph's own test suite with every graph instrumented. Steps updates go to a local HTTP
server that answers ``/kvflow/v1/info`` and ``/kvflow/v1/steps`` like a kvflow server. A graph
``instrument()`` refuses raises, so its test fails. At the end one line reports the compiles, the
updates received, the kvflow warnings the tests saw and the threads still alive
(``KVFLOW_SUITE_REPORT`` names a JSON file to write).
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

_counts = {"compiles": 0, "steps_updates": 0, "TrackingWarning": 0, "UndeclaredTargetsWarning": 0}


class _KVFlowStub(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._reply(200 if self.path == "/kvflow/v1/info" else 404, {"kvflow": True})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path == "/kvflow/v1/steps":
            _counts["steps_updates"] += 1
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {})

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def pytest_configure(config: pytest.Config) -> None:
    from langgraph.graph.state import StateGraph

    from kvflow_orch.langgraph import instrument

    server = ThreadingHTTPServer(("127.0.0.1", 0), _KVFlowStub)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kvflow-suite-stub", daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    compile_plain = StateGraph.compile

    def compile_instrumented(self, *args, **kwargs):
        _counts["compiles"] += 1
        return instrument(compile_plain(self, *args, **kwargs), namespace="t", backend_url=url)

    StateGraph.compile = compile_instrumented
    config._kvflow_stub = server  # type: ignore[attr-defined]


def pytest_warning_recorded(warning_message, when, nodeid, location) -> None:
    name = warning_message.category.__name__
    if name in _counts:
        _counts[name] += 1


def pytest_unconfigure(config: pytest.Config) -> None:
    from kvflow_orch.langgraph import delivery

    delivery().flush(5.0)
    deadline = time.monotonic() + delivery().idle_s + 5
    while delivery().running and time.monotonic() < deadline:  # it stops by itself when idle
        time.sleep(0.05)
    report = {
        **_counts,
        "threads_alive": threading.active_count(),
        "kvflow_threads_alive": sum(t.name.startswith("kvflow-langgraph") for t in threading.enumerate()),
        "updates_dropped": delivery().dropped,
    }
    print(f"\nkvflow instrumentation: {json.dumps(report)}")
    if os.environ.get("KVFLOW_SUITE_REPORT"):
        with open(os.environ["KVFLOW_SUITE_REPORT"], "w") as f:
            json.dump(report, f)
    server = getattr(config, "_kvflow_stub", None)
    if server is not None:
        server.shutdown()
