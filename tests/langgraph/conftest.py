from __future__ import annotations

import importlib.util
import logging
import os
import warnings

import pytest

# The runtime's recording server (a real HTTP server on 127.0.0.1) serves these tests too:
# reuse its fixtures (`server`, `plain_server`) rather than a second copy.
_path = os.path.join(os.path.dirname(__file__), "..", "runtime", "conftest.py")
_spec = importlib.util.spec_from_file_location("runtime_fixtures", _path)
_runtime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runtime)

server = _runtime.server
plain_server = _runtime.plain_server


@pytest.fixture
def strict_tracking(caplog):
    """Fails the test if the tracker saw an impossible transition or the handler raised.

    LangChain swallows callback exceptions (it logs them), so both are checked after the test.
    """
    from kvflow_orch.langgraph import TrackingWarning

    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        yield
    assert [str(w.message) for w in caught if issubclass(w.category, TrackingWarning)] == []
    assert [r.getMessage() for r in caplog.records if "KVFlowCallbackHandler" in r.getMessage()] == []
