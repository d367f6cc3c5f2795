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
    check_steps,
    extract_hint,
    steps_as_json,
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
        ({"workflow_id": "w", "agent": "a", "surprise": 1, "steps": {"a": "x"}}, "steps"),
    ],
)
def test_bad_hints_name_the_field(raw, field):
    with pytest.raises(HintError, match=field):
        extract_hint({"custom_params": {"kvflow": raw}})


def test_unknown_hint_fields_are_dropped_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="kvflow.protocol"):
        hint = extract_hint({"custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "surprise": 1}}})
    assert hint == KVFlowHint(workflow_id="w", agent="a")
    assert "surprise" in caplog.text


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


def test_steps_are_floats_in_python_and_null_for_inf_on_the_wire():
    hint = _hint(steps={"coder": 0.0, "qa": 1.0, "pm": math.inf})
    assert hint.steps == {"coder": 0.0, "qa": 1.0, "pm": math.inf}
    assert all(type(v) is float for v in hint.steps.values())
    assert hint.model_dump_json().count('"steps":{"coder":0,"qa":1,"pm":null}') == 1  # bytes unchanged
    assert _hint() == hint  # the wire form and the Python form are one value
    assert steps_as_json({"a": 0.0, "b": 3.0, "c": math.inf, "d": 1.5}) == {"a": 0, "b": 3, "c": None, "d": 1.5}


def test_non_integer_steps_are_accepted():
    assert KVFlowHint.model_validate({"workflow_id": "w", "agent": "a", "steps": {"a": 0.5}}).steps == {"a": 0.5}


@pytest.mark.parametrize("value", [True, math.nan, -1, -0.5, "1", [1]])
def test_the_one_validator_refuses_bad_values(value):
    with pytest.raises(HintError, match="steps"):
        check_steps({"a": value})
    with pytest.raises(HintError, match="steps"):
        extract_hint({"custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": value}}}})
    with pytest.raises(ValueError, match="steps"):
        StepsUpdate(workflow_id="w", steps={"a": value})


@pytest.mark.parametrize("steps", [{"": 1}, {"x" * (MAX_NAME_LEN + 1): 1}, {f"a{i}": 1 for i in range(MAX_AGENTS + 1)}])
def test_the_one_validator_refuses_bad_names_and_sizes(steps):
    with pytest.raises(HintError):
        check_steps(steps)


def test_read_steps_update_gives_the_status_a_server_answers_with():
    from kvflow_orch.protocol import read_steps_update

    update = read_steps_update(b'{"workflow_id": "w", "steps": {"a": 1, "b": null}}')
    assert update.workflow_id == "w" and update.steps == {"a": 1.0, "b": math.inf}
    for raw, status, needle in ((b"{not json", 400, "not valid JSON"), (b"[1]", 422, "JSON object"),
                                (b'{"workflow_id": "w", "steps": {"a": -1}}', 422, "steps")):
        with pytest.raises(HintError) as caught:
            read_steps_update(raw)
        assert caught.value.status == status and needle in str(caught.value)
