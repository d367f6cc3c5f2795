"""KVFlow state inside one vLLM engine-core process: the brain's request intake (hint table, the
fixed-boundary rule, agent registry, counters), agent tags on prefix block hashes, and the
counters ``/kvflow/v1/stats`` reports.

Pure Python (no vLLM import): the scheduler subclass owns one :class:`KVFlowState` and calls its
verbs; tests drive it directly. What is vLLM's own: hints read from ``kv_transfer_params``, and
tags keyed by vLLM's block hash, which is a function of the block's tokens and its parent's hash,
so a tag outlives the block that carried it: a prefix that is evicted and recomputed gets the same
hash and is tagged again without a new hint. The tag table has its own bound in blocks; a record
the agent registry drops (a moved boundary, a forgotten agent) leaves its tags to that bound.

Continuations (:mod:`backends.kvcache.continuations`, the brain's rule; this module only calls its
verbs): a request's session is its hint's agent, else its explicit key (``kv_transfer_params``
:data:`SESSION_KEY`, which the API server fills from ``prompt_cache_key`` / ``user``). When a request
of a session ends, :meth:`KVFlowState.conclude` hands its full blocks (prompt and reply) to the
intake; a reply that ended in tool calls (the API server parses it and calls the ``pause`` verb) or
a hint's ``resume_in_s`` keeps them, tagged with the continuation's ref, ranked by the brain's
key like any agent's fixed prompt. Past the deadline the tags go (:meth:`KVFlowState.expire`) and
the scheduler puts those free blocks back where evicted blocks are taken first.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from typing import Any, Callable, Hashable, Iterable, Mapping

from backends.kvcache.bounded import Bound, BoundedLRU
from backends.kvcache.config import CacheConfig
from backends.kvcache.hints import AgentRef, HintTable
from backends.kvcache.continuations import Continuation
from backends.kvcache.intake import INTAKE_COUNTERS, UNHINTED, AgentRequest, IntakeDecision, RequestIntake
from backends.kvcache.policy import kvflow_key
from backends.kvcache.stats import CacheStats
from kvflow_orch.protocol import MAX_NAME_LEN, HintError, KVFlowHint, StepsUpdate

from . import CONFIG_ENV, POLICY_NAME

__all__ = ["HINT_KEY", "PREFIX_TOKENS_KEY", "SESSION_KEY", "KVFlowState", "read_hint", "read_session",
           "cache_config_from_env", "current_state", "set_current_state"]

HINT_KEY = "kvflow"                     # kv_transfer_params["kvflow"]: a KVFlowHint as JSON
PREFIX_TOKENS_KEY = "kvflow_prefix_tokens"  # its fixed prefix in tokens, when the API server knew it
SESSION_KEY = "kvflow_session"          # the request's explicit session key (prompt_cache_key, else user)

# Counters of this backend beyond the brain's CacheStats (which the conformance suite compares):
# the intake's, then its own.
EXTRA_COUNTERS = INTAKE_COUNTERS + ("bad_hints", "reorders", "continuations_admitted_first")


def read_hint(params: Mapping[str, Any] | None) -> tuple[KVFlowHint, int | None] | None:
    """The hint a request's ``kv_transfer_params`` carries, with its explicit fixed-prefix length in
    tokens (``None``: infer it); ``None`` without a hint. Raises :class:`HintError` when malformed."""
    if not params or params.get(HINT_KEY) is None:
        return None
    try:
        hint = KVFlowHint.model_validate(params[HINT_KEY])
    except Exception as exc:  # pydantic's ValidationError, or HintError from check_steps
        raise HintError(f"invalid kvflow hint: {exc}") from None
    tokens = params.get(PREFIX_TOKENS_KEY)
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
        raise HintError(f"{PREFIX_TOKENS_KEY} must be an integer >= 0, got {tokens!r}")
    return hint, tokens


def read_session(params: Mapping[str, Any] | None) -> str | None:
    """The explicit session key a request's ``kv_transfer_params`` carries (``None``: none, or not
    a name the API server would have sent: a request that bypassed it is served without one)."""
    key = params.get(SESSION_KEY) if params else None
    return key if isinstance(key, str) and 0 < len(key) <= MAX_NAME_LEN else None


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``KVFLOW_VLLM_CONFIG`` (default: the process's environment) as a JSON object, unchecked
    beyond that (ValueError otherwise): CacheConfig validates the names and values."""
    raw = (environ if environ is not None else os.environ).get(CONFIG_ENV) or "{}"
    try:
        options = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{CONFIG_ENV} is not valid JSON: {exc}") from None
    if not isinstance(options, dict):
        raise ValueError(f"{CONFIG_ENV} must be a JSON object of CacheConfig options")
    return options


def cache_config_from_env(device_tokens: int, environ: dict[str, str] | None = None) -> CacheConfig:
    """The brain's config: ``KVFLOW_VLLM_CONFIG`` options over ``device_tokens`` (the real pool).
    Raises ValueError naming an unknown option or a bad value."""
    config = CacheConfig.from_options(options_from_env(environ), device_tokens=device_tokens,
                                      accepted=CacheConfig.option_names() - {"device_tokens"},
                                      source=f" in {CONFIG_ENV}")
    if config.policy != POLICY_NAME:
        raise ValueError(f"KVFlowScheduler runs the kvflow policy only (stock vLLM is the lru baseline), "
                         f"got policy {config.policy!r}")
    return config



class KVFlowState:
    """Hints, tags and counters of one scheduler. Not thread-safe: the engine-core loop is its
    only writer (requests, steps updates and stats calls all arrive on that loop)."""

    max_tagged_blocks = Bound("tags", "max_entries")

    def __init__(self, config: CacheConfig, block_size: int, *, max_tagged_blocks: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` drives hint TTLs and continuation deadlines (tests pass their own)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.config = config
        self.block_size = block_size
        # the registry records the block hashes each agent's fixed prefix was tagged on
        self.intake: RequestIntake[tuple[Hashable, ...]] = RequestIntake(config, clock=clock)
        # block hash -> agents whose fixed prefix covers it; oldest tagged first.
        self.tags: BoundedLRU[Hashable, set[AgentRef]] = BoundedLRU(
            max_tagged_blocks or max(4 * config.device_tokens // block_size, 4096))
        self.last_free: dict[Hashable, int] = {}  # block hash -> free tick (LRU within a tie)
        self.loose: list[Hashable] = []  # untagged at a deadline, for the scheduler (take_loose)
        self._tick = 0
        self.stats = CacheStats()
        self.counters: Counter[str] = self.intake.counters  # one table: the intake's names, then ours
        self.counters.update({name: 0 for name in EXTRA_COUNTERS if name not in INTAKE_COUNTERS})

    @property
    def hints(self) -> HintTable:
        return self.intake.hints

    # ---- hints ---------------------------------------------------------------------------
    def on_request(self, params: Mapping[str, Any] | None, prompt_ids: list[int],
                   block_hashes: list[Hashable]) -> AgentRef | None:
        """:meth:`accept`, answering with the agent whose fixed prefix was tagged (``None``: none)."""
        return self.accept(params, prompt_ids, block_hashes).agent

    def accept(self, params: Mapping[str, Any] | None, prompt_ids: list[int],
               block_hashes: list[Hashable]) -> IntakeDecision:
        """A request arrives: the intake takes it (its hint, the fixed boundary, its session), then
        the blocks its fixed prefix fills in full are tagged. A malformed hint is counted and ignored
        (the API server already refused it with a 4xx)."""
        self.expire()
        try:
            found = read_hint(params)
        except HintError:
            self.counters["bad_hints"] += 1
            return UNHINTED
        hint, explicit = found if found is not None else (None, None)
        decision = self.intake.accept(AgentRequest(prompt_ids, hint, explicit, read_session(params)))
        ref = decision.agent
        full = min(decision.fixed_tokens // self.block_size, len(block_hashes)) if ref is not None else 0
        if full:
            self.tag(ref, block_hashes[:full])
            self.intake.remember(ref, tuple(block_hashes[:full]), full * self.block_size)
        return decision

    # ---- continuations (the brain's rule: backends.kvcache.continuations) ---------------------
    def conclude(self, decision: IntakeDecision, block_hashes: Iterable[Hashable]) -> bool:
        """A request of a session ended with ``block_hashes`` (the full blocks of its prompt and
        reply) cached: the conversation it returned to is dropped, a hint's ``resume_in_s`` keeps
        the new one. Returns whether any tag changed."""
        if decision.session is None:
            return False
        record = tuple(block_hashes)
        kept, stale = self.intake.conclude(decision, record, len(record) * self.block_size)
        return self._retag(stale, kept)

    def pause(self, session: tuple[str, str], tools: Iterable[str], resume_in_s: float | None = None) -> bool:
        """The session's last reply called ``tools``: keep its conversation until its deadline.
        Returns whether there was one to keep."""
        kept, stale = self.intake.pause(session, tuple(tools), resume_in_s)
        self._retag(stale, kept)
        return kept is not None

    def expire(self) -> bool:
        """Hint TTLs, then continuation deadlines: an expired conversation's blocks lose their tags
        and wait in :attr:`loose` for the scheduler. Returns whether any continuation was kept."""
        self.hints.expire()
        if not len(self.intake.continuations):
            return False
        for ref, record in self.intake.expire_continuations():
            self._untag_record(ref, record, loose=True)
        return True

    def take_loose(self) -> list[Hashable]:
        """Block hashes untagged at a deadline since the last call (still untagged): the scheduler
        moves their free blocks to the front of the free queue, the least recently used place."""
        out = [h for h in self.loose if h not in self.tags]
        self.loose.clear()
        return out

    def _retag(self, stale: list[tuple[AgentRef, tuple[Hashable, ...]]], kept: Continuation | None) -> bool:
        """Untag ``stale`` records, then tag a kept conversation with its continuation's ref."""
        for ref, record in stale:
            self._untag_record(ref, record)
        if kept is not None:
            self.tag(kept.ref, kept.record, stamp=True)
        return bool(stale) or kept is not None

    def _untag_record(self, ref: AgentRef, record: Iterable[Hashable], *, loose: bool = False) -> None:
        for h in record:
            agents = self.tags.get(h)
            if agents is None:
                continue
            agents.discard(ref)
            if not agents:
                self.tags.pop(h)
                self.last_free.pop(h, None)
                if loose:
                    self.loose.append(h)

    def tag(self, ref: AgentRef, hashes: Iterable[Hashable], *, stamp: bool = False) -> None:
        """Tag ``hashes`` with ``ref``; ``stamp``: blocks freed before they were tagged (a paused
        conversation) take the current tick, the LRU order within a tie."""
        for h in hashes:
            agents = self.tags.pop(h) or set()
            agents.add(ref)
            for gone, _ in self.tags.put(h, agents):
                self.last_free.pop(gone, None)
            if stamp and h not in self.last_free:
                self._tick += 1
                self.last_free[h] = self._tick

    def apply_steps(self, update: StepsUpdate) -> None:
        self.intake.apply_steps(update)

    # ---- order ---------------------------------------------------------------------------
    def note_freed(self, block_hash: Hashable) -> None:
        self._tick += 1
        if block_hash in self.tags:
            self.last_free[block_hash] = self._tick

    def key(self, block_hash: Hashable) -> tuple[int, float, float]:
        """The brain's eviction key of a free block (smaller is evicted first)."""
        return kvflow_key(self.tags.get(block_hash), self.hints, self.last_free.get(block_hash, 0))

    def order(self, tagged_free: Iterable[tuple[Hashable, Any]]) -> list[Any]:
        """Tagged free blocks ``(hash, block)`` in eviction order, first evicted first."""
        self.hints.expire()
        return [block for _, block in sorted(tagged_free, key=lambda item: self.key(item[0]))]

    # ---- reporting ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON-ready counters (no prompts, no workflow ids): the brain's CacheStats fields, then
        this backend's own."""
        protected = sum(1 for _, agents in self.tags.items()
                        if any(self.hints.steps(ref) != math.inf for ref in agents))
        return {
            **self.stats.as_dict(),
            **self.counters,
            "workflows": self.hints.workflow_count,
            "agents_with_prefix": len(self.intake.prefixes),
            "continuations": len(self.intake.continuations),
            "tagged_blocks": len(self.tags),
            "protected_blocks": protected,
            "block_size": self.block_size,
            "device_tokens": self.config.device_tokens,
            "namespace_cap_tokens": self.config.effective_namespace_cap,
        }


# The scheduler's state, for the host tier's cache policy in the same engine-core process (vLLM
# builds the policy itself, with no handle on the scheduler).
_CURRENT: KVFlowState | None = None


def current_state() -> KVFlowState | None:
    return _CURRENT


def set_current_state(state: KVFlowState | None) -> None:
    global _CURRENT
    _CURRENT = state
