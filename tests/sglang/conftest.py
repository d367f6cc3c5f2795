"""Fixtures for the SGLang plugin tests: real SGLang 0.5.23 classes on CPU (the rig lives in
sglang_rig.py, shared with the eviction spec's SGLang adapter).

Tests marked ``sglang`` are skipped, with the reason, where sglang is not importable (the main
venv); they run in ``.venv-sglang`` (built by ``.ci/setup-sglang``). Importing sglang happens
lazily, so unmarked tests in this folder run anywhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from sglang_rig import SGLANG_MISSING, SKIP_REASON, CacheRig, load_plugin


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not SGLANG_MISSING:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("sglang") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def plugin() -> Any:
    return load_plugin()


@pytest.fixture
def state(plugin: Any) -> Any:
    from backends.sglang_kvflow.state import reset_state

    return reset_state()


@pytest.fixture
def make_rig(plugin: Any, state: Any):
    rigs: list[CacheRig] = []

    def build(**kwargs: Any) -> CacheRig:
        rig = CacheRig(**kwargs)
        rigs.append(rig)
        return rig

    yield build
    for rig in rigs:
        rig.close()
