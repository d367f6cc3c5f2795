"""Wire protocol: placement identical to SGLang's, limits enforced with messages naming the field."""

from __future__ import annotations

import math

import pytest

from kvflow_orch.protocol import (
    MAX_AGENTS,
    MAX_NAME_LEN,
    HintError,
    KVFlowHint,
    StepsUpdate,
    attach_hint,
    extract_hint,
    steps_to_wire,
)


def _hint(**kw):
    base = dict(workflow_id="wf-1", agent="coder", steps={"coder": 0, "qa": 1, "pm": None}, fixed_prefix=1)
    base.update(kw)
    return KVFlowHint(**base)


def test_openai_placement_is_top_level_custom_params():
    body = attach_hint({"model": "m", "messages": [], "custom_params": {"other": 1}}, _hint())
    assert body["custom_params"]["other"] == 1
    assert body["custom_params"]["kvflow"]["agent"] == "coder"
    assert body["custom_params"]["kvflow"]["steps"] == {"coder": 0, "qa": 1, "pm": None}
    assert extract_hint(body) == _hint()


def test_generate_placement_is_inside_sampling_params():
    body = attach_hint({"text": "hi", "sampling_params": {"max_new_tokens": 4}}, _hint(), route="generate")
    assert body["sampling_params"]["max_new_tokens"] == 4
    assert body["sampling_params"]["custom_params"]["kvflow"]["workflow_id"] == "wf-1"
    assert "custom_params" not in body
    assert extract_hint(body, route="generate") == _hint()
    assert extract_hint(body) is None  # not where OpenAI bodies carry it


def test_attach_does_not_mutate_the_callers_body():
    original = {"sampling_params": {"temperature": 0}}
    attach_hint(original, _hint(), route="generate")
    assert original == {"sampling_params": {"temperature": 0}}


def test_body_without_hint_extracts_none():
    assert extract_hint({"messages": []}) is None
    assert extract_hint({"custom_params": {"something": 1}}) is None


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"workflow_id": "w", "agent": "a", "steps": {"a": -1}}, "steps"),
        ({"workflow_id": "w", "agent": "a", "steps": "nope"}, "steps"),
        ({"workflow_id": "", "agent": "a"}, "workflow_id"),
        ({"workflow_id": "w" * (MAX_NAME_LEN + 1), "agent": "a"}, "workflow_id"),
        ({"workflow_id": "w"}, "agent"),
        ({"workflow_id": "w", "agent": "a", "fixed_prefix": -3}, "fixed_prefix"),
        ({"workflow_id": "w", "agent": "a", "surprise": 1}, "surprise"),
    ],
)
def test_bad_hints_name_the_field(raw, field):
    with pytest.raises(HintError, match=field):
        extract_hint({"custom_params": {"kvflow": raw}})


def test_agent_count_limit():
    steps = {f"a{i}": 1 for i in range(MAX_AGENTS + 1)}
    with pytest.raises(HintError, match=str(MAX_AGENTS)):
        extract_hint({"custom_params": {"kvflow": {"workflow_id": "w", "agent": "a0", "steps": steps}}})
    ok = {f"a{i}": 1 for i in range(MAX_AGENTS)}
    assert len(KVFlowHint(workflow_id="w", agent="a0", steps=ok).steps) == MAX_AGENTS


def test_custom_params_must_be_an_object():
    with pytest.raises(HintError, match="custom_params"):
        extract_hint({"custom_params": [1, 2]})


def test_steps_update_defaults_and_done():
    upd = StepsUpdate(workflow_id="w", steps={"a": 2})
    assert upd.namespace == "default" and upd.done is False
    assert StepsUpdate.model_validate({"workflow_id": "w", "done": True}).done


def test_steps_to_wire_maps_inf_to_none():
    assert steps_to_wire({"a": 0.0, "b": 3.0, "c": math.inf}) == {"a": 0, "b": 3, "c": None}
