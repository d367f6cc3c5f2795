"""Status-aware admission: a prefill adder that skips (``CONTINUE``) requests whose matched path
touches an unacknowledged prefetch, so ready requests behind them run now and the skipped ones stay
in SGLang's waiting queue. Required for correctness, not only speed: a prefetched node looks
device-resident before its copy has landed (see :mod:`backends.sglang_kvflow.hicache_prefetch`).

Returning continuations first (:func:`returns_first`, after SGLang's ``calc_priority`` sorted the
waiting queue): a request that returns to a kept conversation whose KV is still on device (half its
prompt at least) moves ahead of the others, in the brain's order
(:func:`~backends.kvcache.lifecycle.admission_order`: no request is passed over more than
``MAX_PASSED`` times, counted per reordering).
"""

from __future__ import annotations

from array import array
from typing import Any

from backends.kvcache.lifecycle import admission_order

from .hicache_prefetch import is_ready
from .state import get_state
from .tags import session_decision, uses_python_core

__all__ = ["kvflow_adder_class", "wrap_adder_class", "returns_first"]

_PASSED_ATTR = "kvflow_passed"  # times a returning continuation was moved ahead of this Req

_CACHE: dict[type, type] = {}


def kvflow_adder_class(base: type) -> type:
    """A subclass of SGLang's ``PrefillAdder`` (or of whatever class the scheduler uses)."""
    cached = _CACHE.get(base)
    if cached is not None:
        return cached
    from sglang.srt.managers.schedule_policy import AddReqResult

    class KVFlowPrefillAdder(base):  # type: ignore[misc, valid-type]
        def add_one_req(self, req: Any, has_chunked_req: bool, truncation_align_size: Any):
            if not is_ready(self.tree_cache, getattr(req, "last_node", None)):
                get_state().counters["admission_skips"] += 1
                return AddReqResult.CONTINUE
            return super().add_one_req(req, has_chunked_req, truncation_align_size)

    KVFlowPrefillAdder.__qualname__ = f"KVFlowPrefillAdder[{base.__name__}]"
    _CACHE[base] = KVFlowPrefillAdder
    return KVFlowPrefillAdder


def wrap_adder_class(result: type, scheduler: Any, *_: Any, **__: Any) -> type:
    """AFTER ``Scheduler.get_prefill_adder_class``."""
    return kvflow_adder_class(result)


def _resident(cache: Any, req: Any) -> bool:
    from sglang.srt.mem_cache.radix_cache import RadixKey

    ids = req.origin_input_ids
    key = RadixKey(array("q", ids), req.extra_key, is_bigram=cache.tree_core.is_eagle, cache_salt=req.cache_salt)
    return 2 * cache.tree_core.match_full_device_prefix(key)[0] >= len(ids)


def returns_first(result: Any, policy: Any, waiting_queue: list, *_: Any, **__: Any) -> None:
    """AFTER ``SchedulePolicy.calc_priority``: resident returning continuations first (in place)."""
    cache = getattr(policy, "tree_cache", None)
    if cache is None or cache.disable or not uses_python_core(cache):
        return None
    candidates = [r for r in waiting_queue if (d := session_decision(r)) is not None and d.resumes]
    if not candidates:
        return None
    returning = {id(r) for r in candidates if _resident(cache, r)}
    order = admission_order(waiting_queue, lambda r: id(r) in returning, lambda r: getattr(r, _PASSED_ATTR, 0))
    if all(a is b for a, b in zip(order, waiting_queue, strict=True)):
        return None
    for i, req in enumerate(waiting_queue):  # each one a returning request now goes ahead of
        if id(req) not in returning and any(id(r) in returning for r in waiting_queue[i + 1:]):
            setattr(req, _PASSED_ATTR, getattr(req, _PASSED_ATTR, 0) + 1)
    get_state().counters["continuations_admitted_first"] += sum(
        1 for i, req in enumerate(waiting_queue) if id(req) in returning and order[i] is not req)
    waiting_queue[:] = order
    return None
