"""Hints into SGLang: ``custom_params.kvflow`` on requests, and the scheduler messages that carry
out-of-band steps updates and stats queries.

Placement (kvflow_orch/protocol/wire.py): ``/generate`` bodies carry the hint as
``sampling_params.custom_params.kvflow``; ``/v1/*`` bodies as a top-level ``custom_params.kvflow``,
which SGLang copies into ``sampling_params.custom_params``. So one hook in the tokenizer manager
serves both routes (validation, 400 on a bad hint, then the flat form below), and the scheduler
applies the flat form.

What reaches the scheduler is flat. SGLang declares ``custom_params`` values as scalars, lists of
scalars or flat dicts of scalars, and with msgpack IPC (``SGLANG_USE_PICKLE_IPC=0``) the scheduler's
decoder rejects anything deeper, so the HTTP side rewrites the documented nested hint
(``custom_params.kvflow.steps`` is two levels down) into :data:`SCHEDULER_KEYS`:

* ``kvflow_hint``: ``{"workflow_id", "namespace", "agent", "sent_at", "resume_in_s"}``; ``sent_at``
  is the HTTP side's wall clock, the time every TP rank expires hints (and continuations) by
  (:class:`~.state.MessageClock`); ``resume_in_s`` is the hint's announced pause (``None``: none);
* ``kvflow_steps``: the steps in wire form (numbers, ``None`` for never);
* ``kvflow_fixed_tokens``: the fixed-prefix boundary in tokens, computed from the hint's
  ``fixed_prefix`` (characters of a text prompt, or leading chat messages rendered with the chat
  template). Without it the scheduler's intake infers one (backends/kvcache/intake.py);
* ``kvflow_session``: ``{"key", "sent_at"}``, the request's explicit session key (OpenAI's
  ``prompt_cache_key``, else ``user``), put there by the routes' middleware (:mod:`.routes`), which
  also sends a :class:`KVFlowPauseReq` when a chat reply calls tools (continuations).

Messages are msgspec structs registered with ``hook_custom_types`` in every process, and reach the
scheduler through its request socket, so rank 0 broadcasts them to all TP ranks in the same
iteration: every rank applies the same update (eviction is decided per rank and must agree).
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any, Dict, Mapping, NamedTuple, Optional

from sglang.srt.managers.io_struct import BaseReq, hook_custom_types

from backends.kvcache.segment import common_prefix_len
from kvflow_orch.protocol import MAX_NAME_LEN, HintError, KVFlowHint, StepsUpdate, extract_hint, steps_as_json

from .state import get_state

__all__ = [
    "FIXED_TOKENS_KEY", "HINT_KEY", "STEPS_KEY", "SESSION_KEY", "SCHEDULER_KEYS", "SchedulerHint",
    "flatten_for_scheduler", "KVFlowStepsReq", "KVFlowStatsReq", "KVFlowStatsReqOutput", "KVFlowPauseReq",
    "read_request_session",
    "read_request_hint", "parse_custom_params", "register_message_types",
    "validate_generate_request", "install_scheduler_handlers", "install_stats_communicator",
    "fixed_tokens_for_text", "fixed_tokens_for_messages", "mark_chat_boundary",
]

logger = logging.getLogger(__name__)

FIXED_TOKENS_KEY = "kvflow_fixed_tokens"
HINT_KEY = "kvflow_hint"
STEPS_KEY = "kvflow_steps"
SESSION_KEY = "kvflow_session"
SCHEDULER_KEYS = (HINT_KEY, STEPS_KEY, FIXED_TOKENS_KEY, SESSION_KEY)


class KVFlowStepsReq(BaseReq, kw_only=True):
    """An out-of-band :class:`~kvflow_orch.protocol.StepsUpdate`, already validated.

    ``steps`` is in the wire form (``steps_as_json``: numbers, ``None`` for never), plain data for
    msgpack; the scheduler validates it back into a StepsUpdate."""

    workflow_id: str
    namespace: str
    steps: Dict[str, Optional[float]]
    done: bool = False
    sent_at: Optional[float] = None  # the HTTP side's clock (see MessageClock)


class KVFlowPauseReq(BaseReq, kw_only=True):
    """A chat reply of session ``(namespace, key)`` called ``tools``: keep its conversation (the
    brain's :meth:`~backends.kvcache.intake.RequestIntake.pause`)."""

    namespace: str
    key: str
    tools: list[str]
    sent_at: Optional[float] = None  # the HTTP side's clock (see MessageClock)


class KVFlowStatsReq(BaseReq, kw_only=True):
    """Ask every scheduler (one per DP rank) for its KVFlow counters."""


class KVFlowStatsReqOutput(BaseReq, kw_only=True):
    stats: Dict[str, Any]


def register_message_types() -> None:
    """Extend SGLang's msgpack decoder; needed in every process that receives these messages."""
    hook_custom_types(KVFlowStepsReq, KVFlowStatsReq, KVFlowStatsReqOutput, KVFlowPauseReq)


def parse_custom_params(custom_params: Any) -> tuple[KVFlowHint, int | None] | None:
    """``(hint, explicit fixed-prefix tokens)`` from a request's ``custom_params``; ``None`` when it
    carries no kvflow hint. Raises :class:`HintError` (a ValueError) naming the bad field."""
    if custom_params is None:
        return None
    if not isinstance(custom_params, Mapping):
        raise HintError("custom_params must be an object")
    hint = extract_hint({"custom_params": custom_params}, route="openai")
    forged = sorted(k for k in (HINT_KEY, STEPS_KEY) if k in custom_params)
    if forged:
        raise HintError(f"custom_params.{forged[0]} is set by the server; send the hint as custom_params.kvflow")
    if hint is None:
        return None
    explicit = custom_params.get(FIXED_TOKENS_KEY)
    if explicit is not None and (isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 0):
        raise HintError(f"custom_params.{FIXED_TOKENS_KEY} must be an integer >= 0, got {explicit!r}")
    return hint, explicit


def flatten_for_scheduler(custom_params: Mapping[str, Any], hint: KVFlowHint, fixed_tokens: int | None,
                          sent_at: float) -> dict[str, Any]:
    """``custom_params`` with the nested hint replaced by the flat :data:`SCHEDULER_KEYS` (other
    keys are kept as they are)."""
    out = {k: v for k, v in custom_params.items() if k not in ("kvflow", FIXED_TOKENS_KEY)}
    out[HINT_KEY] = {"workflow_id": hint.workflow_id, "namespace": hint.namespace, "agent": hint.agent,
                     "sent_at": sent_at, "resume_in_s": hint.resume_in_s}
    out[STEPS_KEY] = steps_as_json(hint.steps)
    if fixed_tokens is not None:
        out[FIXED_TOKENS_KEY] = fixed_tokens
    return out


class SchedulerHint(NamedTuple):
    """What the scheduler reads from a request: the hint, the explicit boundary, the stamp."""

    hint: KVFlowHint
    fixed_tokens: int | None
    sent_at: float | None


def read_request_hint(custom_params: Any) -> SchedulerHint | None:
    """Scheduler-side reader of the flat form. A malformed one (a request that bypassed the HTTP
    side, e.g. sent over the scheduler's socket by another client) is ignored, never fatal."""
    if not isinstance(custom_params, Mapping):
        return None
    head, steps = custom_params.get(HINT_KEY), custom_params.get(STEPS_KEY)
    if not isinstance(head, Mapping):
        return None
    try:
        hint = KVFlowHint(workflow_id=head.get("workflow_id"), namespace=head.get("namespace"),
                          agent=head.get("agent"), steps=steps if steps is not None else {},
                          resume_in_s=head.get("resume_in_s"))
    except ValueError:  # pydantic's ValidationError and HintError are both ValueErrors
        return None
    explicit = custom_params.get(FIXED_TOKENS_KEY)
    if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 0:
        explicit = None
    sent_at = head.get("sent_at")
    if isinstance(sent_at, bool) or not isinstance(sent_at, (int, float)):
        sent_at = None
    return SchedulerHint(hint, explicit, sent_at)


def read_request_session(custom_params: Any) -> tuple[str, float | None] | None:
    """Scheduler-side reader of :data:`SESSION_KEY`: ``(key, sent_at)``; ``None`` without one (or a
    malformed one, from a client that bypassed the HTTP side)."""
    session = custom_params.get(SESSION_KEY) if isinstance(custom_params, Mapping) else None
    key = session.get("key") if isinstance(session, Mapping) else None
    if not isinstance(key, str) or not 0 < len(key) <= MAX_NAME_LEN:
        return None
    sent_at = session.get("sent_at")
    return key, (None if isinstance(sent_at, bool) or not isinstance(sent_at, (int, float)) else float(sent_at))


def fixed_tokens_for_text(tokenizer: Any, text: str, fixed_chars: int) -> int:
    """Tokens of ``text`` that come from its first ``fixed_chars`` characters: the common token
    prefix of the whole text and of that head (tokenizers may merge across the boundary)."""
    return common_prefix_len(tokenizer.encode(text), tokenizer.encode(text[:fixed_chars]))


def fixed_tokens_for_messages(tokenizer: Any, messages: list[dict], fixed_messages: int,
                              prompt_ids: list[int]) -> int:
    """Tokens of a chat prompt that come from its first ``fixed_messages`` messages: the common
    prefix of the full prompt and of the chat template applied to those messages alone."""
    head = tokenizer.apply_chat_template(messages[:fixed_messages], tokenize=True, add_generation_prompt=False)
    if isinstance(head, Mapping):  # some tokenizers return a BatchEncoding
        head = head["input_ids"]
    return common_prefix_len(prompt_ids, list(head))


def mark_chat_boundary(result: Any, serving_chat: Any, request: Any, *_: Any, **__: Any) -> None:
    """AFTER ``OpenAIServingChat._convert_to_internal_request``: turn the hint's ``fixed_prefix``
    (a number of messages) into tokens of the templated prompt, so the scheduler tags exactly the
    fixed part from the first request on. Without it the scheduler falls back to segmentation."""
    adapted = result[0]
    sampling = adapted.sampling_params if isinstance(adapted.sampling_params, dict) else None
    parsed = parse_custom_params(sampling.get("custom_params")) if sampling else None
    if parsed is None or parsed[1] is not None or parsed[0].fixed_prefix is None:
        return None
    tokenizer = getattr(serving_chat.tokenizer_manager, "tokenizer", None)
    if tokenizer is None:
        return None
    messages = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in request.messages]
    ids = adapted.input_ids if isinstance(adapted.input_ids, list) else None
    if ids is None and isinstance(adapted.text, str):
        ids = tokenizer.encode(adapted.text)
    if ids is None:
        return None
    try:
        n = fixed_tokens_for_messages(tokenizer, messages, parsed[0].fixed_prefix, ids)
    except Exception:  # a template that cannot render a partial conversation: segmentation decides
        logger.debug("kvflow: chat template refused a partial conversation; using segmentation", exc_info=True)
        return None
    sampling["custom_params"] = {**sampling["custom_params"], FIXED_TOKENS_KEY: n}
    return None


def _sampling_dicts(obj: Any) -> list[dict]:
    params = getattr(obj, "sampling_params", None)
    if params is None:
        return []
    if isinstance(params, dict):
        return [params]
    if isinstance(params, list):
        return [p for p in params if isinstance(p, dict)]
    return []


def validate_generate_request(tokenizer_manager: Any, obj: Any, *_: Any, **__: Any) -> None:
    """BEFORE ``TokenizerManager.generate_request`` (both /generate and /v1/* pass here): reject a
    malformed hint with a ValueError, which SGLang answers with HTTP 400 and the message, and
    rewrite a good one into the flat form the scheduler's msgpack decoder accepts."""
    text = getattr(obj, "text", None)
    sent_at = time.time()
    for sampling in _sampling_dicts(obj):
        parsed = parse_custom_params(sampling.get("custom_params"))
        if parsed is None:
            continue
        hint, explicit = parsed
        tokenizer = getattr(tokenizer_manager, "tokenizer", None)
        if explicit is None and hint.fixed_prefix is not None and isinstance(text, str) and tokenizer:
            explicit = fixed_tokens_for_text(tokenizer, text, hint.fixed_prefix)
        sampling["custom_params"] = flatten_for_scheduler(sampling["custom_params"], hint, explicit, sent_at)
    return None


def handle_steps(scheduler: Any, msg: KVFlowStepsReq) -> None:
    update = StepsUpdate(workflow_id=msg.workflow_id, namespace=msg.namespace, steps=msg.steps, done=msg.done)
    state = get_state()
    state.clock.advance(msg.sent_at)
    state.intake.apply_steps(update)
    return None  # no reply: the HTTP route answered after validating


def handle_pause(scheduler: Any, msg: KVFlowPauseReq) -> None:
    from .tags import pause_session

    state = get_state()
    state.clock.advance(msg.sent_at)
    pause_session(getattr(scheduler, "tree_cache", None), (msg.namespace, msg.key), list(msg.tools))
    return None  # no reply: the reply that called the tools goes on to the client


def handle_stats(scheduler: Any, msg: KVFlowStatsReq) -> KVFlowStatsReqOutput:
    from .stats import scheduler_stats

    return KVFlowStatsReqOutput(stats=scheduler_stats(scheduler, get_state()))


def install_scheduler_handlers(result: Any, scheduler: Any, *_: Any, **__: Any) -> None:
    """AFTER ``Scheduler.init_request_dispatcher`` (the cache exists by then): route our messages
    to their handlers, and size the namespace cap from the device pool."""
    from sglang.utils import TypeBasedDispatcher

    pool = getattr(scheduler, "max_total_num_tokens", None)
    if isinstance(pool, int) and pool > 0:
        get_state().use_device_pool(pool)

    scheduler._request_dispatcher += TypeBasedDispatcher([
        (KVFlowStepsReq, partial(handle_steps, scheduler)),
        (KVFlowStatsReq, partial(handle_stats, scheduler)),
        (KVFlowPauseReq, partial(handle_pause, scheduler)),
    ])
    return None


def install_stats_communicator(result: Any, tokenizer_manager: Any, *_: Any, **__: Any) -> None:
    """AFTER ``TokenizerManager.init_request_dispatcher``: a fan-out communicator that collects one
    stats reply per DP rank, like SGLang's own control requests."""
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.runtime_context import get_parallel
    from sglang.utils import TypeBasedDispatcher

    communicator = FanOutCommunicator(tokenizer_manager._dispatch_to_scheduler, get_parallel().num_dp_ranks)
    tokenizer_manager.kvflow_stats_communicator = communicator
    tokenizer_manager._result_dispatcher += TypeBasedDispatcher([(KVFlowStatsReqOutput, communicator.handle_recv)])
    return None
