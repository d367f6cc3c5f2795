"""Wire protocol between the orchestrator and every kvflow backend.

One client speaks to both backends, so the placement is the one SGLang 0.5.23 accepts:

* OpenAI-compatible bodies (``/v1/chat/completions``, ``/v1/completions``) carry the hint as a
  top-level ``custom_params: {"kvflow": {...}}``;
* ``/generate`` bodies carry it as ``sampling_params.custom_params.kvflow``;
* out-of-band updates go to ``POST /kvflow/v1/steps`` as a :class:`StepsUpdate`.

Steps are described in :mod:`kvflow_orch.protocol.limits`: floats (``math.inf`` = "not expected to
run again") in Python, non-negative numbers or ``null`` on the wire.
"""

from __future__ import annotations

import json

import logging
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator

from .errors import HintError
from .limits import DEFAULT_NAMESPACE, check_name, check_steps, steps_as_json

__all__ = ["STEPS_ROUTE", "INFO_ROUTE", "STATS_ROUTE", "KVFlowHint", "StepsUpdate", "attach_hint", "extract_hint",
           "read_steps_update"]

STEPS_ROUTE = "/kvflow/v1/steps"
INFO_ROUTE = "/kvflow/v1/info"
STATS_ROUTE = "/kvflow/v1/stats"

log = logging.getLogger("kvflow.protocol")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    # ``steps`` in Python: agent -> float, ``math.inf`` for "not expected again" (what a tracker
    # gives). On the wire and in model_dump(): ``null`` for inf, JSON integers for integral values,
    # so ``{"coder": 0.0, "qa": 1.0, "pm": inf}`` is sent as ``{"coder": 0, "qa": 1, "pm": null}``.
    # Either form is accepted on input; check_steps is the one validator.
    @field_validator("steps", mode="before", check_fields=False)
    @classmethod
    def _v_steps(cls, value: Any) -> dict[str, float]:
        return check_steps(value)

    @field_serializer("steps", check_fields=False)
    def _s_steps(self, steps: dict[str, float]) -> dict[str, int | float | None]:
        return steps_as_json(steps)


class KVFlowHint(_Strict):
    """Per-request hint: who is calling and how far every agent of the workflow is from running.

    ``fixed_prefix`` is how many leading chat messages are the agent's fixed prompt (or, for a
    raw-text prompt, how many characters); ``None`` lets the backend infer the boundary.
    ``steps``: agent -> float (``math.inf``: not expected again); on the wire
    ``{"coder": 0, "qa": 1, "pm": null}``.
    """

    workflow_id: str
    namespace: str = DEFAULT_NAMESPACE
    agent: str
    steps: dict[str, float] = Field(default_factory=dict)
    fixed_prefix: int | None = Field(default=None, ge=0)

    _v_ids = field_validator("workflow_id", "namespace", "agent")(
        lambda v, info: check_name(v, info.field_name)
    )


class StepsUpdate(_Strict):
    """Out-of-band update of a workflow's steps (``POST /kvflow/v1/steps``).

    ``done=True`` tells the backend the workflow has ended: it forgets every step it holds for it.
    ``steps`` has the same two forms as :attr:`KVFlowHint.steps`.
    """

    workflow_id: str
    namespace: str = DEFAULT_NAMESPACE
    steps: dict[str, float] = Field(default_factory=dict)
    done: bool = False

    _v_ids = field_validator("workflow_id", "namespace")(
        lambda v, info: check_name(v, info.field_name)
    )


def attach_hint(body: dict[str, Any], hint: KVFlowHint, *, route: str = "openai") -> dict[str, Any]:
    """Return a copy of ``body`` carrying ``hint`` where ``route`` ("openai" or "generate") expects it."""
    out = dict(body)
    payload = {"kvflow": hint.model_dump(mode="json")}
    if route == "generate":
        sampling = dict(out.get("sampling_params") or {})
        sampling["custom_params"] = {**(sampling.get("custom_params") or {}), **payload}
        out["sampling_params"] = sampling
    elif route == "openai":
        out["custom_params"] = {**(out.get("custom_params") or {}), **payload}
    else:
        raise ValueError(f"unknown route kind {route!r}; expected 'openai' or 'generate'")
    return out


def extract_hint(body: Mapping[str, Any], *, route: str = "openai") -> KVFlowHint | None:
    """Read the hint from a request body; ``None`` when the body carries none.

    Raises :class:`HintError` (with pydantic's message naming the field) for a malformed hint.
    Fields this version does not know are dropped with a warning (a newer client's hint still
    works); the known ones are validated strictly.
    """
    if route == "generate":
        container = (body.get("sampling_params") or {}).get("custom_params")
    else:
        container = body.get("custom_params")
    if container is None:
        return None
    if not isinstance(container, Mapping):
        raise HintError("custom_params must be an object")
    raw = container.get("kvflow")
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        unknown = sorted(str(k) for k in raw if k not in KVFlowHint.model_fields)
        if unknown:
            log.warning("ignoring unknown kvflow hint field(s) %s", ", ".join(unknown)[:200])
            raw = {k: v for k, v in raw.items() if k in KVFlowHint.model_fields}
    try:
        return KVFlowHint.model_validate(raw)
    except ValidationError as exc:
        raise HintError(f"invalid kvflow hint: {_describe(exc)}") from None


def read_steps_update(raw: bytes) -> StepsUpdate:
    """Parse a ``POST /kvflow/v1/steps`` body (what servers that are not pydantic-routed use).

    Raises :class:`HintError` whose ``status`` is 400 for a body that is not JSON and 422 for JSON
    that is not a valid :class:`StepsUpdate` (the message names the field)."""
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise HintError(f"body is not valid JSON: {exc}", status=400) from None
    if not isinstance(body, dict):
        raise HintError("body must be a JSON object (a StepsUpdate)")
    try:
        return StepsUpdate.model_validate(body)
    except ValidationError as exc:
        raise HintError(f"invalid steps update: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "hint"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
