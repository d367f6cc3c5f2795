"""Where the vLLM backend's API server puts a hint (no vLLM needed): ``custom_params.kvflow`` (kvflow's
one client) is moved to ``kv_transfer_params.kvflow``, the field vLLM hands to the scheduler; a
malformed hint in either place is refused with a message naming the field."""

from __future__ import annotations

import pytest

from backends.vllm_kvflow.routes import rewrite_body
from kvflow_orch.protocol import HintError, KVFlowHint, attach_hint

HINT = KVFlowHint(workflow_id="wf", agent="coder", steps={"coder": 0, "qa": 1}, fixed_prefix=1)


def _body(**extra) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], **extra}


def test_custom_params_hint_moves_to_kv_transfer_params_and_other_fields_stay() -> None:
    body = attach_hint(_body(custom_params={"mine": 1}, kv_transfer_params={"other": True}), HINT)
    out = rewrite_body(body, "/v1/chat/completions", tokenizer=None)
    assert out["custom_params"] == {"mine": 1}
    assert out["kv_transfer_params"]["other"] is True
    assert out["kv_transfer_params"]["kvflow"] == HINT.model_dump(mode="json")
    assert out["messages"] == body["messages"]


def test_kv_transfer_params_hint_is_accepted_as_is_and_no_hint_means_no_change() -> None:
    out = rewrite_body(_body(kv_transfer_params={"kvflow": HINT.model_dump(mode="json")}), "/v1/chat/completions", None)
    assert out["kv_transfer_params"]["kvflow"]["agent"] == "coder" and "custom_params" not in out
    assert rewrite_body(_body(), "/v1/chat/completions", None) is None


@pytest.mark.parametrize("body, field", [
    (_body(custom_params={"kvflow": {"workflow_id": "w", "agent": "a", "steps": {"a": -1}}}), "steps"),
    (_body(kv_transfer_params={"kvflow": {"agent": "a"}}), "workflow_id"),
    (_body(kv_transfer_params=[1]), "kv_transfer_params"),
    (_body(custom_params="x"), "custom_params"),
])
def test_malformed_hints_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(HintError, match=field):
        rewrite_body(body, "/v1/chat/completions", None)


def test_cache_salt_reaches_vllm_untouched() -> None:
    # vLLM keys its prefix-cache blocks by cache_salt itself (the first block's hash, chained on):
    # the hint rewrite must hand the field on as sent, beside the moved hint.
    body = attach_hint(_body(cache_salt="tenant-a"), HINT)
    out = rewrite_body(body, "/v1/chat/completions", tokenizer=None)
    assert out["cache_salt"] == "tenant-a" and out["kv_transfer_params"]["kvflow"]["agent"] == "coder"
