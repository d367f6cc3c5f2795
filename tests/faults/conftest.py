"""Fault tests run against the real tiny-random engine behind the real server on 127.0.0.1."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # test folders are not packages; kvflow_live is the shared helper
