"""Fractional (expected) steps inside SGLang: the plugin parses them as they are (the eviction
order by them is the eviction spec's ``fractional_steps_order_as_numbers``, run on SGLang too)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang


def test_parse_keeps_fractional_steps(plugin):
    from backends.sglang_kvflow.hints_bridge import parse_custom_params

    hint, _ = parse_custom_params({"kvflow": {"workflow_id": "w", "agent": "A", "steps": {"A": 0, "B": 3.25}}})
    assert hint.steps == {"A": 0, "B": 3.25}
