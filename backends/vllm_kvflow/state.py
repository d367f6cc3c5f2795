"""KVFlow state inside one vLLM engine-core process: the brain's request intake (hint table, the
fixed-boundary rule, agent registry, counters), agent tags on prefix block hashes, and the
counters ``/kvflow/v1/stats`` reports.

Pure Python (no vLLM import): the scheduler subclass owns one :class:`KVFlowState` and calls its
verbs; tests drive it directly. What is vLLM's own: hints read from ``kv_transfer_params``, and
tags keyed by vLLM's block hash, which is a function of the block's tokens and its parent's hash,
so a tag outlives the block that carried it: a prefix that is evicted and recomputed gets the same
hash and is tagged again without a new hint. The tag table has its own bound in blocks; a record
the agent registry drops (a moved boundary, a forgotten agent) leaves its tags to that bound.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from typing import Any, Hashable, Iterable, Mapping

from backends.kvcache.bounded import Bound, BoundedLRU
from backends.kvcache.config import CacheConfig
from backends.kvcache.hints import AgentRef, HintTable
from backends.kvcache.intake import INTAKE_COUNTERS, AgentRequest, RequestIntake
from backends.kvcache.policy import kvflow_key
from backends.kvcache.stats import CacheStats
from kvflow_orch.protocol import HintError, KVFlowHint, StepsUpdate

from . import CONFIG_ENV, POLICY_NAME

__all__ = ["HINT_KEY", "PREFIX_TOKENS_KEY", "KVFlowState", "read_hint", "cache_config_from_env", "current_state",
           "set_current_state"]

HINT_KEY = "kvflow"                     # kv_transfer_params["kvflow"]: a KVFlowHint as JSON
PREFIX_TOKENS_KEY = "kvflow_prefix_tokens"  # its fixed prefix in tokens, when the API server knew it

# Counters of this backend beyond the brain's CacheStats (which the conformance suite compares):
# the intake's, then its own.
EXTRA_COUNTERS = INTAKE_COUNTERS + ("bad_hints", "reorders")


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


def cache_config_from_env(device_tokens: int, environ: dict[str, str] | None = None) -> CacheConfig:
    """The brain's config: ``KVFLOW_VLLM_CONFIG`` options over ``device_tokens`` (the real pool).
    Raises ValueError naming an unknown option or a bad value."""
    raw = (environ if environ is not None else os.environ).get(CONFIG_ENV) or "{}"
    try:
        options = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{CONFIG_ENV} is not valid JSON: {exc}") from None
    if not isinstance(options, dict):
        raise ValueError(f"{CONFIG_ENV} must be a JSON object of CacheConfig options")
    config = CacheConfig.from_options(options, device_tokens=device_tokens,
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

    def __init__(self, config: CacheConfig, block_size: int, *, max_tagged_blocks: int | None = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.config = config
        self.block_size = block_size
        # the registry records the block hashes each agent's fixed prefix was tagged on
        self.intake: RequestIntake[tuple[Hashable, ...]] = RequestIntake(config)
        # block hash -> agents whose fixed prefix covers it; oldest tagged first.
        self.tags: BoundedLRU[Hashable, set[AgentRef]] = BoundedLRU(
            max_tagged_blocks or max(4 * config.device_tokens // block_size, 4096))
        self.last_free: dict[Hashable, int] = {}  # block hash -> free tick (LRU within a tie)
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
        """A request arrives: the intake takes it (its hint, the fixed boundary), then the blocks
        its fixed prefix fills in full are tagged. A malformed hint is counted and ignored (the API
        server already refused it with a 4xx)."""
        try:
            found = read_hint(params)
        except HintError:
            self.counters["bad_hints"] += 1
            return None
        hint, explicit = found if found is not None else (None, None)
        decision = self.intake.accept(AgentRequest(prompt_ids, hint, explicit))
        ref = decision.agent
        if ref is None:
            return None
        full = min(decision.fixed_tokens // self.block_size, len(block_hashes))
        if full:
            self.tag(ref, block_hashes[:full])
            self.intake.remember(ref, tuple(block_hashes[:full]), full * self.block_size)
        return ref

    def tag(self, ref: AgentRef, hashes: Iterable[Hashable]) -> None:
        for h in hashes:
            agents = self.tags.pop(h) or set()
            agents.add(ref)
            for gone, _ in self.tags.put(h, agents):
                self.last_free.pop(gone, None)

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
