"""Fractional (expected) steps inside SGLang: the plugin parses them and its eviction order matches
backends/kvcache's on them, eviction by eviction."""

from __future__ import annotations

import pytest

import test_eviction_conformance as conformance

pytestmark = pytest.mark.sglang

FLOAT_STEPS = {"A": 2.75, "B": 0.5, "C": 2.5, "D": None}


def test_parse_keeps_fractional_steps(plugin):
    from backends.sglang_kvflow.hints_bridge import parse_custom_params

    hint, _ = parse_custom_params({"kvflow": {"workflow_id": "w", "agent": "A", "steps": {"A": 0, "B": 3.25}}})
    assert hint.steps == {"A": 0, "B": 3.25}


def test_device_eviction_order_by_fractional_steps_matches_backends_kvcache(make_rig, monkeypatch):
    monkeypatch.setattr(conformance, "STEPS", FLOAT_STEPS)
    rig = conformance._build_sglang(make_rig)
    brain = conformance._build_brain()
    device = conformance._evict_in_lockstep(rig, brain, host=False)
    fixed = conformance.FIXED
    # which agent's fixed prefix (first round requests: A, B, C, D) is lost first: D (inf), A (2.75), C (2.5), B
    lost = []
    for held in device:
        for i, agent in enumerate("ABCD"):
            if held[i] < fixed and agent not in lost:
                lost.append(agent)
    assert lost == ["D", "A", "C", "B"]
