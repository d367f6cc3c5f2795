"""The contract between the orchestrator and every kvflow backend.

A leaf: it imports pydantic and the standard library only, so backends, servers and plugins can
depend on it without loading the orchestrator.

* :mod:`.wire` — :class:`KVFlowHint`, :class:`StepsUpdate`, where hints sit in request bodies, routes;
* :mod:`.limits` — size limits and the one validator of ids, step maps and ``cache_salt``;
* :mod:`.errors` — :class:`HintError`, :class:`HintLocationError`;
* :mod:`.sampling` — :class:`Sampling`, the sampling parameters of a call;
* :mod:`.trace` — the record format of ``kvflow run --record``.
"""

from __future__ import annotations

from .errors import HintError, HintLocationError
from .limits import (DEFAULT_NAMESPACE, MAX_AGENTS, MAX_CACHE_SALT_LEN, MAX_NAME_LEN, MAX_RESUME_IN_S, check_cache_salt,
                     check_name, check_resume_in_s, check_steps, steps_as_json)
from .sampling import Sampling
from .trace import FORMAT_VERSION, CallRecord, NodeRecord, read_calls, write_calls
from .wire import (CUSTOM_PARAMS, GENERATE_PARAMS, HINT_LOCATIONS, INFO_ROUTE, KV_TRANSFER_PARAMS,
                   OPENAI_HINT_LOCATIONS, LEARNED_ROUTE, STATS_ROUTE, STEPS_ROUTE, KVFlowHint, StepsUpdate,
                   attach_hint, extract_hint, hint_location, read_steps_update)

__all__ = [
    "MAX_NAME_LEN",
    "MAX_AGENTS",
    "MAX_CACHE_SALT_LEN",
    "check_cache_salt",
    "MAX_RESUME_IN_S",
    "check_resume_in_s",
    "DEFAULT_NAMESPACE",
    "STEPS_ROUTE",
    "INFO_ROUTE",
    "STATS_ROUTE",
    "LEARNED_ROUTE",
    "KVFlowHint",
    "StepsUpdate",
    "HintError",
    "HintLocationError",
    "CUSTOM_PARAMS",
    "KV_TRANSFER_PARAMS",
    "GENERATE_PARAMS",
    "OPENAI_HINT_LOCATIONS",
    "HINT_LOCATIONS",
    "hint_location",
    "Sampling",
    "check_name",
    "check_steps",
    "steps_as_json",
    "attach_hint",
    "extract_hint",
    "read_steps_update",
    "FORMAT_VERSION",
    "NodeRecord",
    "CallRecord",
    "write_calls",
    "read_calls",
]
