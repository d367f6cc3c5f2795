"""Shared fixtures for the embedded engine's tests (tiny-random: seeded, fast, deterministic)."""

from __future__ import annotations

import pytest
import torch

from backends.local.model.loader import LoadedModel, load_model
from backends.local.pools import KVPool


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny-random", seed=0)


@pytest.fixture()
def tiny_pool(tiny: LoadedModel) -> KVPool:
    return KVPool(tiny.model.cfg, 4096, device="cpu", dtype=torch.float32)
