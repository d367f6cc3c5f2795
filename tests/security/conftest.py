"""Security tests run against the real tiny-random engine behind the real server on 127.0.0.1."""

from __future__ import annotations

import os
import sys

# Test folders are not packages: share tests/faults' live-server helper (kvflow_live) by path.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "faults"))
