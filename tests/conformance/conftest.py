"""The ``backend`` fixture: every kvflow backend that can run here, each on its own tiny-random
engine (a 1,024-token device pool with a host tier, kvflow policy, prefetch on)."""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest

from backends.local import Engine, EngineConfig
from backends.server import create_app, serve_in_thread

sys.path.insert(0, os.path.dirname(__file__))  # test folders are not packages
from backends_under_test import Backend, InProcess, OverHTTP  # noqa: E402

CONFIG = EngineConfig.build(model="tiny-random", device_tokens=1024, host_tokens=4096, policy="kvflow", prefetch=True)

BACKENDS = [
    "in-process",
    "http",
    pytest.param("sglang", marks=pytest.mark.skip(
        reason="SGLang 0.5.23 serves models only on a GPU; this machine is CPU-only "
               "(the plugin's CPU tests live in tests/sglang)")),
]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    engine = Engine(CONFIG)
    if request.param == "in-process":
        try:
            yield InProcess(engine)
        finally:
            engine.close()
    else:
        with serve_in_thread(create_app(engine)) as running:
            yield OverHTTP(running.url)
