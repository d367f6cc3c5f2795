"""Wire protocol between the orchestrator and every kvflow backend.

Where a hint sits in a request body (:data:`HINT_LOCATIONS`, dotted paths):

* OpenAI-compatible bodies (``/v1/chat/completions``, ``/v1/completions``): top-level
  ``custom_params.kvflow`` (what the embedded server and SGLang 0.5.23 accept, and the default) or
  ``kv_transfer_params.kvflow`` (vLLM's own field, which reaches its scheduler as is);
* Responses API bodies (``/v1/responses``): top-level ``custom_params.kvflow`` on the embedded
  server (:data:`RESPONSES_HINT_LOCATIONS`); a server names them as ``hints.responses``;
* ``/generate`` bodies: ``sampling_params.custom_params.kvflow``.

A server names the OpenAI locations it reads in ``GET /kvflow/v1/info`` as
``"hints": {"openai": [...]}``, preferred first; :func:`hint_location` picks the one a client
uses. Out-of-band updates go to ``POST /kvflow/v1/steps`` as a :class:`StepsUpdate`.

Steps are described in :mod:`kvflow_orch.protocol.limits`: floats (``math.inf`` = "not expected to
run again") in Python, non-negative numbers or ``null`` on the wire.
"""

from __future__ import annotations

import json

import logging
from typing import Any, Mapping

from pydantic import (BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, field_serializer,
                      field_validator, model_serializer)

from .errors import HintError, HintLocationError
from .limits import DEFAULT_NAMESPACE, check_name, check_resume_in_s, check_steps, steps_as_json

__all__ = ["STEPS_ROUTE", "INFO_ROUTE", "STATS_ROUTE", "LEARNED_ROUTE", "KVFlowHint", "StepsUpdate", "attach_hint",
           "extract_hint", "read_steps_update", "CUSTOM_PARAMS", "KV_TRANSFER_PARAMS", "GENERATE_PARAMS",
           "OPENAI_HINT_LOCATIONS", "RESPONSES_HINT_LOCATIONS", "HINT_LOCATIONS", "hint_location"]

STEPS_ROUTE = "/kvflow/v1/steps"
INFO_ROUTE = "/kvflow/v1/info"
STATS_ROUTE = "/kvflow/v1/stats"
LEARNED_ROUTE = "/kvflow/v1/learned"
"""What a server learned from unhinted traffic: agents and transitions (issue 23)."""

log = logging.getLogger("kvflow.protocol")

CUSTOM_PARAMS = "custom_params.kvflow"
"""OpenAI bodies, top-level ``custom_params``: the default (servers whose info names no location)."""
KV_TRANSFER_PARAMS = "kv_transfer_params.kvflow"
"""OpenAI bodies, vLLM's ``kv_transfer_params`` (handed to its scheduler and KV connector)."""
GENERATE_PARAMS = "sampling_params.custom_params.kvflow"
"""``/generate`` bodies (SGLang's native route and the embedded server's)."""
OPENAI_HINT_LOCATIONS = (CUSTOM_PARAMS, KV_TRANSFER_PARAMS)
RESPONSES_HINT_LOCATIONS = (CUSTOM_PARAMS,)
"""Where ``/v1/responses`` bodies carry the hint (``hints.responses`` in a server's info)."""
HINT_LOCATIONS = (*OPENAI_HINT_LOCATIONS, GENERATE_PARAMS)
_ROUTE_LOCATIONS = {"openai": CUSTOM_PARAMS, "responses": CUSTOM_PARAMS, "generate": GENERATE_PARAMS}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # no "yes" for True, no "1" for 1

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
    ``resume_in_s``: the agent pauses after this call (it runs a tool, waits for a user) and calls
    again in about this many seconds; the backend keeps the conversation (prompt and reply) for
    that call (issue 24's continuations). ``None``: no pause announced (a reply that ends in tool
    calls is still kept, for a deadline the backend learns from the tools' observed durations).
    """

    workflow_id: str
    namespace: str = DEFAULT_NAMESPACE
    agent: str
    steps: dict[str, float] = Field(default_factory=dict)
    fixed_prefix: int | None = Field(default=None, ge=0)
    resume_in_s: float | None = None

    @field_validator("resume_in_s", mode="before")
    @classmethod
    def _v_resume(cls, value: Any) -> float | None:
        return check_resume_in_s(value)

    _v_ids = field_validator("workflow_id", "namespace", "agent")(
        lambda v, info: check_name(v, info.field_name)
    )

    @model_serializer(mode="wrap")
    def _s_hint(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a hint without a pause is dumped, and so travels, as before resume_in_s existed: servers
        # older than it take the hint, and equality with older dumps holds
        data = handler(self)
        if self.resume_in_s is None:
            data.pop("resume_in_s", None)
        return data


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


def _location(route: str, location: str | None) -> list[str]:
    """The path of ``location`` (default: the one of ``route``) as its keys."""
    if location is None:
        if route not in _ROUTE_LOCATIONS:
            raise ValueError(f"unknown route kind {route!r}; expected one of {', '.join(_ROUTE_LOCATIONS)}")
        location = _ROUTE_LOCATIONS[route]
    elif location not in HINT_LOCATIONS:
        raise ValueError(f"unknown hint location {location!r}; expected one of {', '.join(HINT_LOCATIONS)}")
    return location.split(".")


def attach_hint(body: dict[str, Any], hint: KVFlowHint, *, route: str = "openai",
                location: str | None = None) -> dict[str, Any]:
    """Return a copy of ``body`` carrying ``hint`` at ``location`` (one of :data:`HINT_LOCATIONS`;
    default: where ``route``, "openai" or "generate", carries it by default). The objects on the
    way are copied; what else they hold stays."""
    *path, key = _location(route, location)
    out = dict(body)
    node = out
    for part in path:
        child = node.get(part)
        node[part] = dict(child) if isinstance(child, Mapping) else {}
        node = node[part]
    node[key] = hint.model_dump(mode="json")
    return out


def extract_hint(body: Mapping[str, Any], *, route: str = "openai", location: str | None = None) -> KVFlowHint | None:
    """Read the hint at ``location`` (default: ``route``'s, as :func:`attach_hint`); ``None`` when
    the body carries none there.

    Raises :class:`HintError` (with pydantic's message naming the field) for a malformed hint or a
    container on its path that is not an object. Fields this version does not know are dropped
    with a warning (a newer client's hint still works); the known ones are validated strictly.
    """
    *path, key = _location(route, location)
    container: Any = body
    for depth, part in enumerate(path):
        container = container.get(part)
        if container is None:
            return None
        if not isinstance(container, Mapping):
            raise HintError(f"{'.'.join(path[: depth + 1])} must be an object")
    raw = container.get(key)
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


def hint_location(*infos: Mapping[str, Any]) -> str:
    """Where OpenAI-route hints go for the server(s) whose ``/kvflow/v1/info`` answers are ``infos``.

    Each info's ``hints.openai`` lists the locations it reads, preferred first; an info without it
    (a server older than the field) reads :data:`CUSTOM_PARAMS`. The answer is the first location
    of the first info's list that every info lists and this client knows (several infos: the
    workers behind one gateway, any of which may get the request). Raises
    :class:`HintLocationError`, naming the server's lists and the locations known here, when there
    is none, or when ``hints`` is not of that shape: never a request that silently carries no hint.
    """
    if not infos:
        raise ValueError("hint_location needs at least one info")
    lists = [_openai_locations(info) for info in infos]
    for location in lists[0]:
        if location in OPENAI_HINT_LOCATIONS and all(location in other for other in lists[1:]):
            return location
    named = " and ".join(f"[{', '.join(map(str, lst))}]" for lst in lists)
    raise HintLocationError(
        f"the server reads hints only at {named}; this client can put them at "
        f"{', '.join(OPENAI_HINT_LOCATIONS)} (upgrade kvflow on the side that is older)"
    )


def _openai_locations(info: Mapping[str, Any]) -> list[Any]:
    hints = info.get("hints")
    if hints is None:
        return [CUSTOM_PARAMS]
    openai = hints.get("openai") if isinstance(hints, Mapping) else None
    if openai is None and isinstance(hints, Mapping):
        return [CUSTOM_PARAMS]  # locations for other routes only
    if not isinstance(openai, list) or not all(isinstance(x, str) for x in openai):
        raise HintLocationError(
            f"the server's info has a malformed hints field {hints!r:.200}: expected "
            f'{{"openai": [location, ...]}} with locations among {", ".join(OPENAI_HINT_LOCATIONS)}')
    return openai


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
