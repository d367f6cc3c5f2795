"""The wire contract parses as SECURITY.md promises: strictly. A value of the wrong JSON type is an
error naming the field, never coerced (``"yes"`` is not ``true``, ``"1"`` is not ``1``); a step too
large for a float is a :class:`HintError` naming the entry, not an OverflowError."""

from __future__ import annotations

import json
import math

import pytest

from kvflow_orch.protocol import HintError, KVFlowHint, StepsUpdate, check_steps, extract_hint, read_steps_update

HUGE = "1" + "0" * 400  # a JSON integer past float's range


@pytest.mark.parametrize("done", ["yes", "off", "true", 1, 0, "1", 1.0, None])
def test_done_is_a_json_boolean_only(done: object) -> None:
    with pytest.raises(HintError, match=r"done: Input should be a valid boolean") as raised:
        read_steps_update(json.dumps({"workflow_id": "w", "done": done}).encode())
    assert raised.value.status == 422
    assert read_steps_update(b'{"workflow_id": "w", "done": true}').done is True
    assert read_steps_update(b'{"workflow_id": "w", "done": false}').done is False


@pytest.mark.parametrize("fixed", ["1", True, False, 1.0, "0"])
def test_fixed_prefix_is_a_json_integer_only(fixed: object) -> None:
    body = {"custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "fixed_prefix": fixed}}}
    with pytest.raises(HintError, match=r"fixed_prefix: Input should be a valid integer"):
        extract_hint(json.loads(json.dumps(body)))
    body["custom_params"]["kvflow"]["fixed_prefix"] = 2
    assert extract_hint(body).fixed_prefix == 2


@pytest.mark.parametrize("resume", [-1, -0.5, 86400.5, float("nan"), float("inf"), True, "3", [3]])
def test_resume_in_s_is_a_finite_bounded_number_of_seconds(resume: object) -> None:
    body = {"custom_params": {"kvflow": {"workflow_id": "w", "agent": "a", "resume_in_s": resume}}}
    with pytest.raises(HintError, match=r"resume_in_s"):
        extract_hint(body)
    with pytest.raises(HintError, match=r"resume_in_s is an integer of"):
        extract_hint(json.loads(f'{{"custom_params": {{"kvflow": {{"workflow_id": "w", "agent": "a", '
                                f'"resume_in_s": {HUGE}}}}}}}'))
    for good in (0, 2.5, 86400, None):
        body["custom_params"]["kvflow"]["resume_in_s"] = good
        assert extract_hint(body).resume_in_s == (None if good is None else float(good))


def test_a_hint_without_a_pause_travels_as_before() -> None:
    from kvflow_orch.protocol import attach_hint
    plain = attach_hint({}, KVFlowHint(workflow_id="w", agent="a"))["custom_params"]["kvflow"]
    assert "resume_in_s" not in plain
    paused = attach_hint({}, KVFlowHint(workflow_id="w", agent="a", resume_in_s=4))["custom_params"]["kvflow"]
    assert paused["resume_in_s"] == 4.0


def test_the_models_built_in_python_are_strict_too() -> None:
    with pytest.raises(ValueError):
        StepsUpdate(workflow_id="w", done="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        KVFlowHint(workflow_id="w", agent="a", fixed_prefix="3")  # type: ignore[arg-type]
    hint = KVFlowHint(workflow_id="w", agent="a", steps={"a": 0, "b": None}, fixed_prefix=3)
    assert hint.steps == {"a": 0.0, "b": math.inf} and hint.fixed_prefix == 3


def test_a_step_past_floats_range_names_the_entry() -> None:
    for sign in ("", "-"):
        raw = f'{{"workflow_id": "w", "steps": {{"coder": {sign}{HUGE}}}}}'
        with pytest.raises(HintError, match=r"steps\.coder is an integer of 1329 bits") as raised:
            read_steps_update(raw.encode())
        assert raised.value.status == 422
    hint = f'{{"workflow_id": "w", "agent": "a", "steps": {{"qa": {HUGE}}}}}'
    body = json.loads(f'{{"custom_params": {{"kvflow": {hint}}}}}')
    with pytest.raises(HintError, match=r"steps\.qa is an integer of 1329 bits, past the largest number"):
        extract_hint(body)
    with pytest.raises(HintError, match="must be >= 0"):
        check_steps({"qa": -(10**400)})
    assert check_steps({"qa": 10**300}) == {"qa": 1e300}  # large but a float: accepted
