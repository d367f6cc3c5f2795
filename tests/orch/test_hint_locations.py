"""Hint locations: every location the protocol names round-trips through attach/extract without
touching its neighbours, and the one a client uses is chosen from the server's /kvflow/v1/info
(first known entry of ``hints.openai``; none named = ``custom_params.kvflow``; only unknown ones =
an error naming both lists)."""

from __future__ import annotations

import pytest

from kvflow_orch.protocol import (
    CUSTOM_PARAMS,
    GENERATE_PARAMS,
    HINT_LOCATIONS,
    KV_TRANSFER_PARAMS,
    HintError,
    HintLocationError,
    KVFlowHint,
    attach_hint,
    extract_hint,
    hint_location,
)

HINT = KVFlowHint(workflow_id="wf", namespace="ns", agent="coder", steps={"coder": 0, "qa": None}, fixed_prefix=2)


def _at(body: dict, location: str):
    for part in location.split("."):
        body = body[part]
    return body


@pytest.mark.parametrize("location", HINT_LOCATIONS)
def test_every_location_round_trips_and_keeps_its_neighbours(location: str) -> None:
    first = location.split(".")[0]
    original = {"model": "m", "messages": [], first: {"mine": 1}}
    body = attach_hint(original, HINT, location=location)
    assert _at(body, location) == HINT.model_dump(mode="json")
    assert body[first]["mine"] == 1 and original == {"model": "m", "messages": [], first: {"mine": 1}}
    assert extract_hint(body, location=location) == HINT
    for other in HINT_LOCATIONS:  # it is only where it was put
        if other != location:
            assert extract_hint(body, location=other) is None


def test_route_defaults_are_custom_params_and_generate_params() -> None:
    expected = {"custom_params": {"kvflow": HINT.model_dump(mode="json")}}
    assert attach_hint({}, HINT) == attach_hint({}, HINT, location=CUSTOM_PARAMS) == expected
    assert extract_hint(attach_hint({}, HINT, route="generate"), location=GENERATE_PARAMS) == HINT


def test_unknown_location_and_non_object_containers_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown hint location 'extra.kvflow'.*kv_transfer_params.kvflow"):
        attach_hint({}, HINT, location="extra.kvflow")
    with pytest.raises(HintError, match="kv_transfer_params must be an object"):
        extract_hint({"kv_transfer_params": [1]}, location=KV_TRANSFER_PARAMS)
    with pytest.raises(HintError, match="sampling_params.custom_params must be an object"):
        extract_hint({"sampling_params": {"custom_params": "x"}}, location=GENERATE_PARAMS)
    with pytest.raises(HintError, match="workflow_id"):
        extract_hint({"kv_transfer_params": {"kvflow": {"agent": "a"}}}, location=KV_TRANSFER_PARAMS)


@pytest.mark.parametrize("info, expected", [
    ({"model": "m"}, CUSTOM_PARAMS),  # a server older than the field
    ({"hints": {}}, CUSTOM_PARAMS),  # locations for other routes only
    ({"hints": {"openai": [CUSTOM_PARAMS]}}, CUSTOM_PARAMS),
    ({"hints": {"openai": [KV_TRANSFER_PARAMS, CUSTOM_PARAMS]}}, KV_TRANSFER_PARAMS),  # the server's preference
    ({"hints": {"openai": ["headers.x-kvflow", CUSTOM_PARAMS]}}, CUSTOM_PARAMS),  # the first one known here
])
def test_location_is_chosen_from_the_info(info: dict, expected: str) -> None:
    assert hint_location(info) == expected


def test_several_servers_share_the_first_location_all_read() -> None:
    vllm = {"hints": {"openai": [KV_TRANSFER_PARAMS, CUSTOM_PARAMS]}}
    assert hint_location(vllm, {"model": "old"}) == CUSTOM_PARAMS
    assert hint_location(vllm, vllm) == KV_TRANSFER_PARAMS
    with pytest.raises(HintLocationError, match=r"\[kv_transfer_params.kvflow\] and \[custom_params.kvflow\]"):
        hint_location({"hints": {"openai": [KV_TRANSFER_PARAMS]}}, {})


@pytest.mark.parametrize("hints", [{"openai": ["headers.x-kvflow"]}, {"openai": []}])
def test_only_unknown_locations_is_an_error_naming_both_lists(hints: dict) -> None:
    with pytest.raises(HintLocationError) as caught:
        hint_location({"hints": hints})
    message = str(caught.value)
    assert f"[{', '.join(hints['openai'])}]" in message
    assert CUSTOM_PARAMS in message and KV_TRANSFER_PARAMS in message


@pytest.mark.parametrize("hints", [["custom_params.kvflow"], {"openai": "custom_params.kvflow"}, {"openai": [1]}])
def test_a_malformed_hints_field_is_an_error(hints) -> None:
    with pytest.raises(HintLocationError, match="malformed hints"):
        hint_location({"hints": hints})
