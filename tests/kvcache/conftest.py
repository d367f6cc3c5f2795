"""Fixtures for the cache-brain tests (helpers live in kvcache_helpers.py: conftest modules of
other test folders share the name ``conftest``)."""

from __future__ import annotations

import pytest

from backends.kvcache import CacheConfig, KVCache
from kvcache_helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_cache(clock):
    def build(device_tokens: int = 64, host_tokens: int = 0, **kw) -> KVCache:
        return KVCache(CacheConfig(device_tokens=device_tokens, host_tokens=host_tokens, **kw), clock=clock)
    return build
