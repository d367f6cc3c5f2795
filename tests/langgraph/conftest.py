from __future__ import annotations

import importlib.util
import os

# The runtime's recording server (a real HTTP server on 127.0.0.1) serves these tests too:
# reuse its fixtures (`server`, `plain_server`) rather than a second copy.
_path = os.path.join(os.path.dirname(__file__), "..", "runtime", "conftest.py")
_spec = importlib.util.spec_from_file_location("runtime_fixtures", _path)
_runtime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_runtime)

server = _runtime.server
plain_server = _runtime.plain_server
