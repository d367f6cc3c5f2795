"""Status-aware admission: a prefill adder that skips (``CONTINUE``) requests whose matched path
touches an unacknowledged prefetch, so ready requests behind them run now and the skipped ones stay
in SGLang's waiting queue. Required for correctness, not only speed: a prefetched node looks
device-resident before its copy has landed (see :mod:`backends.sglang_kvflow.hicache_prefetch`).
"""

from __future__ import annotations

from typing import Any

from .hicache_prefetch import is_ready
from .state import get_state

__all__ = ["kvflow_adder_class", "wrap_adder_class"]

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
