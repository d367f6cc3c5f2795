"""Wire protocol between the orchestrator and every kvflow backend.

One client speaks to both backends, so the placement is the one SGLang 0.5.23 accepts:

* OpenAI-compatible bodies (``/v1/chat/completions``, ``/v1/completions``) carry the hint as a
  top-level ``custom_params: {"kvflow": {...}}``;
* ``/generate`` bodies carry it as ``sampling_params.custom_params.kvflow``;
* out-of-band updates go to ``POST /kvflow/v1/steps`` as a :class:`StepsUpdate`.

Steps are non-negative integers; ``None`` means "not expected to run again" (infinity).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "MAX_NAME_LEN",
    "MAX_AGENTS",
    "DEFAULT_NAMESPACE",
    "STEPS_ROUTE",
    "INFO_ROUTE",
    "STATS_ROUTE",
    "KVFlowHint",
    "StepsUpdate",
    "HintError",
    "steps_to_wire",
    "check_name",
    "attach_hint",
    "extract_hint",
]

MAX_NAME_LEN = 256
MAX_AGENTS = 4096
DEFAULT_NAMESPACE = "default"
STEPS_ROUTE = "/kvflow/v1/steps"
INFO_ROUTE = "/kvflow/v1/info"
STATS_ROUTE = "/kvflow/v1/stats"


class HintError(ValueError):
    """A hint or steps update that does not follow the protocol; the message names the field."""


def check_name(value: str, what: str) -> str:
    """``value`` if it is a valid id (non-empty, at most MAX_NAME_LEN characters); else ValueError
    naming ``what``."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    if len(value) > MAX_NAME_LEN:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {MAX_NAME_LEN}")
    return value


def _check_steps(steps: dict[str, int | None]) -> dict[str, int | None]:
    if len(steps) > MAX_AGENTS:
        raise ValueError(f"steps names {len(steps)} agents; the limit is {MAX_AGENTS}")
    for agent, value in steps.items():
        check_name(agent, "agent name in steps")
        if value is not None and value < 0:
            raise ValueError(f"steps[{agent!r}] is {value}; steps-to-execution must be >= 0 or null")
    return steps


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class KVFlowHint(_Strict):
    """Per-request hint: who is calling and how far every agent of the workflow is from running.

    ``fixed_prefix`` is how many leading chat messages are the agent's fixed prompt (or, for a
    raw-text prompt, how many characters); ``None`` lets the backend infer the boundary.
    """

    workflow_id: str
    namespace: str = DEFAULT_NAMESPACE
    agent: str
    steps: dict[str, int | None] = Field(default_factory=dict)
    fixed_prefix: int | None = Field(default=None, ge=0)

    _v_ids = field_validator("workflow_id", "namespace", "agent")(
        lambda v, info: check_name(v, info.field_name)
    )
    _v_steps = field_validator("steps")(lambda v: _check_steps(v))


class StepsUpdate(_Strict):
    """Out-of-band update of a workflow's steps (``POST /kvflow/v1/steps``).

    ``done=True`` tells the backend the workflow has ended: it forgets every step it holds for it.
    """

    workflow_id: str
    namespace: str = DEFAULT_NAMESPACE
    steps: dict[str, int | None] = Field(default_factory=dict)
    done: bool = False

    _v_ids = field_validator("workflow_id", "namespace")(
        lambda v, info: check_name(v, info.field_name)
    )
    _v_steps = field_validator("steps")(lambda v: _check_steps(v))


def steps_to_wire(steps: Mapping[str, float]) -> dict[str, int | None]:
    """Convert tracker steps (floats, ``math.inf`` for never) into the wire form (ints, ``None``)."""
    return {name: (None if math.isinf(v) else int(v)) for name, v in steps.items()}


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
    try:
        return KVFlowHint.model_validate(raw)
    except ValidationError as exc:
        raise HintError(f"invalid kvflow hint: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "hint"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
