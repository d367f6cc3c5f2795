"""The ``backend`` fixture: every kvflow backend that can run here, each on its own tiny-random
engine (a 1,024-token device pool with a host tier, kvflow policy, prefetch on), and vLLM with the
kvflow scheduler on SmolLM2 (a 512-token pool of 32-token blocks, float32) where vLLM is installed
(``.venv-vllm/bin/python -m pytest tests/conformance -m vllm``)."""

from __future__ import annotations

from typing import Iterator

import pytest

from backends.local import Engine, EngineConfig
from backends.server import create_app, serve_in_thread

from backends_under_test import Backend, InProcess, OverHTTP
from vllm_server import HAVE_VLLM, SKIP_REASON, export_smollm2, vllm_server

CONFIG = EngineConfig.build(model="tiny-random", device_tokens=1024, host_tokens=4096, policy="kvflow", prefetch=True)

BACKENDS = [
    "in-process",
    "http",
    pytest.param("sglang", marks=pytest.mark.skip(
        reason="SGLang 0.5.23 serves models only on a GPU; this machine is CPU-only "
               "(the plugin's CPU tests live in tests/sglang)")),
    pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.timeout(1200),
                                pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)]),
]
VLLM_FLAGS = ["--device-tokens", "512", "--block-size", "32", "--dtype", "float32"]  # CPU blocks: multiples of 32


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    if request.param == "vllm":
        folder = tmp_path_factory.mktemp("vllm")
        with vllm_server(export_smollm2(folder), folder / "server.log", VLLM_FLAGS) as url:
            # vLLM caches whole blocks: the ~80-token system prompt is reused as 2 blocks of 32
            yield OverHTTP(url, name="vllm", min_prefix_reuse=48)
        return
    engine = Engine(CONFIG)
    if request.param == "in-process":
        try:
            yield InProcess(engine)
        finally:
            engine.close()
    else:
        with serve_in_thread(create_app(engine)) as running:
            yield OverHTTP(running.url)
