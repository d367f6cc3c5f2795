"""Agent tags on SGLang tree nodes: which agents' fixed prefixes run through a node.

* When a request is queued in the scheduler, the brain's intake takes it
  (:meth:`~backends.kvcache.intake.RequestIntake.accept`: the hint table, the one fixed-boundary
  rule, the counters) with the explicit boundary the HTTP side computed, if any; the decision is
  stashed on the request.
* After ``UnifiedRadixCache.checkpoint_into_tree`` the nodes root..boundary get the agent's tag
  (matching the fixed-prefix key splits the node at the boundary, so the dynamic suffix stays
  untagged), and the intake's agent registry records where the prefix lives (prefetch loads it).
  Tags of a record the registry drops (a moved boundary, a forgotten agent) stay on their nodes
  and leave with them as SGLang evicts them.
* Continuations (the brain's rule, :mod:`backends.kvcache.continuations`; these hooks call its
  verbs): a request with a session (its hint's agent, or the explicit key the routes pass as
  ``kvflow_session``) concludes its turn at its final checkpoint (prompt and reply are in the tree
  then), which keeps it at once when its hint announced ``resume_in_s``; a chat reply that called
  tools reaches the scheduler as a pause message (:func:`pause_session`). The kept conversation is
  tagged root..end with the continuation's ref and ranked by the strategy's key like any fixed
  prompt; at its deadline (swept by the message clock when a request or a pause arrives) its tags
  go, without touching the nodes' recency: as evictable as any dynamic suffix.
* ``UnifiedTreeCore._split_node`` does not copy unknown attributes: the split hook copies the tags
  (and the prefetch marker) onto the new upper node. Demotion and load-back keep the same node
  object, so tags survive the host tier.
"""

from __future__ import annotations

from array import array
from typing import Any

from backends.kvcache.continuations import Continuation
from backends.kvcache.hints import AgentRef
from backends.kvcache.intake import AgentRequest

from .hints_bridge import read_request_hint, read_request_session
from .state import PrefixKey, get_state

__all__ = ["TAGS_ATTR", "LOADING_ATTR", "node_tags", "on_request_queued", "tag_after_checkpoint",
           "split_keeps_tags", "split_stamp_before", "tag_path", "untag_path", "prefix_radix_key", "uses_python_core",
           "pause_session", "retag", "session_decision"]

TAGS_ATTR = "kvflow_tags"        # set[AgentRef] on UnifiedTreeNode (it has no __slots__)
LOADING_ATTR = "kvflow_loading"  # anchor id of the prefetch loading this node
_SPLIT_STAMP_ATTR = "kvflow_split_stamp"  # the child's last_access_time while _split_node runs
_REQ_ATTR = "kvflow_prefix"      # (AgentRef, fixed_len) stashed on the scheduler's Req
_TAGGED_ATTR = "kvflow_tagged"   # tokens of that prefix tagged since the Req was (re)queued
_SESSION_ATTR = "kvflow_session"  # the intake's decision for a Req of a session, until it concludes


def node_tags(node: Any) -> set[AgentRef] | None:
    return getattr(node, TAGS_ATTR, None)


def on_request_queued(scheduler: Any, req: Any, is_retracted: bool = False, *_: Any, **__: Any) -> None:
    """BEFORE ``Scheduler._add_request_to_queue``: the intake takes the request (every TP rank sees
    the same request, so every rank's table changes alike) and decides its fixed-prefix length."""
    if is_retracted or getattr(req, _REQ_ATTR, None) is not None or getattr(req, _SESSION_ATTR, None) is not None:
        # A retracted request comes back: its hint was applied when it first arrived, but the tree
        # may have dropped its prefix meanwhile, so the next checkpoints tag it again.
        if getattr(req, _TAGGED_ATTR, None) is not None:
            setattr(req, _TAGGED_ATTR, 0)
        return
    custom_params = getattr(req.sampling_params, "custom_params", None)
    found = read_request_hint(custom_params)
    session = read_request_session(custom_params)
    state = get_state()
    if session is not None:
        state.clock.advance(session[1])
    if found is not None:
        state.clock.advance(found.sent_at)
    if session is not None or found is not None:  # a stamped message: deadlines are due by its clock
        retag(getattr(scheduler, "tree_cache", None), state.intake.expire_continuations(), None)
    key = session[0] if session is not None else None
    if found is None:
        decision = state.intake.accept(AgentRequest(req.origin_input_ids, session=key))  # counted as unhinted
    else:
        decision = state.intake.accept(AgentRequest(req.origin_input_ids, found.hint, found.fixed_tokens, key))
        setattr(req, _REQ_ATTR, (decision.agent, decision.fixed_tokens))
    if decision.session is not None:
        setattr(req, _SESSION_ATTR, decision)


def session_decision(req: Any) -> Any:
    """The intake's decision for a queued request of a session (``None``: none, or concluded)."""
    return getattr(req, _SESSION_ATTR, None) or None


def uses_python_core(cache: Any) -> bool:
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    return isinstance(getattr(cache, "tree_core", None), UnifiedTreeCore)


def prefix_radix_key(cache: Any, prefix: PrefixKey) -> Any:
    """The page-aligned ``RadixKey`` under which ``cache`` stores ``prefix`` (tagging and prefetch
    must look it up the same way the insert stored it)."""
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", prefix.token_ids), prefix.extra_key, is_bigram=cache.tree_core.is_eagle,
                    cache_salt=prefix.cache_salt).page_aligned(cache.page_size)


def tag_path(cache: Any, ref: AgentRef, key: Any) -> int:
    """Tag root..end of ``key`` (from :func:`prefix_radix_key`) in ``cache`` with ``ref``; returns
    the tagged token count (less than ``len(key)`` while the tree holds only part of it)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    if len(key) == 0:
        return 0
    core = cache.tree_core
    match = cache.match_prefix(MatchPrefixParams(key=key))
    node = core.node_by_id(match.best_match_node)
    tagged = 0
    while node is not None and node is not core.root_node:
        tags = node.__dict__.setdefault(TAGS_ATTR, set())
        tags.add(ref)
        tagged += len(node.key)
        node = node.parent
    return tagged


def untag_path(cache: Any, ref: AgentRef, key: Any) -> None:
    """Drop ``ref``'s tag from the nodes root..end of ``key`` (from :func:`prefix_radix_key`), on
    device or host alike, without splitting a node or touching its recency."""
    core = cache.tree_core
    node, rest = core.root_node, key
    while len(rest) > 0:
        child = node.children.get(rest.child_key(cache.page_size))
        if child is None:
            return
        matched = child.key.match(rest, page_size=cache.page_size)
        if matched == 0:
            return
        tags = getattr(child, TAGS_ATTR, None)
        if tags:
            tags.discard(ref)
        node, rest = child, rest[matched:]
        if matched < len(child.key):
            return


def retag(cache: Any, stale: list[tuple[AgentRef, PrefixKey]], kept: Continuation | None) -> None:
    """Untag ``stale`` records, then tag a kept conversation with its continuation's ref. Without a
    tree to act on (a test's scheduler-less call) the work waits in the state for the next one."""
    state = get_state()
    if cache is None or getattr(cache, "disable", False) or not uses_python_core(cache):
        if stale or kept is not None:
            state.pending_retags.append((stale, kept))
        return
    pending, state.pending_retags = state.pending_retags, []
    for old_stale, old_kept in [*pending, (stale, kept)]:
        for ref, prefix in old_stale:
            untag_path(cache, ref, prefix_radix_key(cache, prefix))
        if old_kept is not None:
            tag_path(cache, old_kept.ref, prefix_radix_key(cache, old_kept.record))


def pause_session(cache: Any, session: tuple[str, str], tools: list[str]) -> bool:
    """A reply of ``session`` called ``tools``: the brain keeps its last conversation (see
    :meth:`RequestIntake.pause <backends.kvcache.intake.RequestIntake.pause>`), tagged here.
    Deadlines due by the message clock are swept first. Returns whether one was kept."""
    intake = get_state().intake
    retag(cache, intake.expire_continuations(), None)
    kept, stale = intake.pause(session, tools)
    retag(cache, stale, kept)
    return kept is not None


def _conclude(cache: Any, req: Any, up_to: int | None) -> None:
    """A finished request of a session: its conversation (what the final checkpoint inserted) goes
    to the intake, which drops the continuation it returned to (a hint's ``resume_in_s`` keeps the
    new one at once). Once per request; an aborted one inserts nothing worth keeping."""
    decision = getattr(req, _SESSION_ATTR, None)
    if decision is None or not req.finished():
        return
    setattr(req, _SESSION_ATTR, False)  # concluded (and not taken again as a new request)
    if type(req.finished_reason).__name__ == "FINISH_ABORT":
        return
    tokens = tuple(req.full_untruncated_fill_ids[:up_to] if up_to is not None else req.full_untruncated_fill_ids)
    record = PrefixKey(tokens, req.extra_key, req.cache_salt)
    kept, stale = get_state().intake.conclude(decision, record, len(tokens))
    retag(cache, stale, kept)


def tag_after_checkpoint(result: Any, cache: Any, req: Any, *_: Any, **kwargs: Any) -> None:
    """AFTER ``UnifiedRadixCache.checkpoint_into_tree``: tag the fixed prefix the insert covered,
    and conclude a finished request's turn (continuations).

    SGLang checkpoints a request after every prefill chunk, after its prefill and at its end; the
    prefix is tagged until it is covered in full, and the request is counted once."""
    if not cache.disable:
        _conclude(cache, req, kwargs.get("up_to"))
    stash = getattr(req, _REQ_ATTR, None)
    if stash is None or cache.disable:
        return None
    ref, fixed_len = stash
    if fixed_len <= 0:
        return None
    if not uses_python_core(cache):
        return None  # tags need the Python tree core; register() forces it and logs so
    prefix = PrefixKey(tuple(req.origin_input_ids[:fixed_len]), req.extra_key, req.cache_salt)
    key = prefix_radix_key(cache, prefix)
    done = getattr(req, _TAGGED_ATTR, None)  # None: never tagged; else tokens tagged so far
    if done is not None and done >= len(key):
        return None  # tagged in full at an earlier checkpoint; req still locks that path
    tagged = tag_path(cache, ref, key)
    if tagged <= 0:
        return None
    setattr(req, _TAGGED_ATTR, tagged)
    if done is None:
        get_state().intake.remember(ref, prefix, fixed_len)
    return None


def split_stamp_before(core: Any, key: Any, child: Any, split_len: int, *_: Any, **__: Any) -> None:
    """BEFORE ``UnifiedTreeCore._split_node``: remember the child's recency. SGLang 0.5.23 stamps the
    child (the unmatched tail) with a fresh ``last_access_time`` although its comment says a split
    does not access it, so a match that splits an old node would make that tail look recent and
    break LRU order within a tie (the eviction spec's ``without_hints_the_order_is_lru``)."""
    setattr(child, _SPLIT_STAMP_ATTR, child.last_access_time)


def split_keeps_tags(result: Any, core: Any, key: Any, child: Any, split_len: int) -> None:
    """AFTER ``UnifiedTreeCore._split_node`` (returns ``(new_node, action)``): the new upper node
    carries the same tokens' tags, and is part of the same prefetch load as its child."""
    new_node = result[0] if isinstance(result, tuple) else result
    stamp = getattr(child, _SPLIT_STAMP_ATTR, None)
    if stamp is not None:  # the tail was not accessed: it keeps its recency (split_stamp_before)
        child.last_access_time = stamp
        delattr(child, _SPLIT_STAMP_ATTR)
    tags = getattr(child, TAGS_ATTR, None)
    if tags:
        setattr(new_node, TAGS_ATTR, set(tags))
    loading = getattr(child, LOADING_ATTR, None)
    if loading is not None:
        setattr(new_node, LOADING_ATTR, loading)
    return None
