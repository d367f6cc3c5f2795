"""Replay a recorded request sequence on a block-granular prefix cache, the way vLLM caches.

The brain's own replay (:mod:`backends.kvcache.trace`) works on radix nodes at token granularity; vLLM
caches KV in blocks of ``block_size`` tokens (128 on its CPU backend) and hits only whole blocks. So
the brain's Bélády is no bound for vLLM's hit tokens. This module replays the same requests on a
pool of ``blocks`` physical blocks with vLLM's rules:

* a block is identified by its whole prefix chain (its tokens and every block before it, as vLLM's
  block hash is); only **full** blocks are cached; a partial last block is freed without content;
* a request hits the longest run of cached blocks from its first, and at most ``(len(prompt) - 1)
  // block_size`` blocks (vLLM always computes a prompt's last token, so a prompt that is an exact
  multiple of the block size leaves its last block to compute);
* a running request holds (pins) its blocks: the hit ones and a new block for every other block of
  its prompt and its generated tokens; it releases them when it finishes, and only unpinned blocks
  can be evicted; a never-used free block is taken before any cached block is evicted;
* the requests start and finish in the recorded order (:attr:`Request.start`, :attr:`Request.end`:
  any comparable stamps; concurrent requests overlap), so the replay sees the concurrency the run had.

Eviction policies (which cached, unpinned block a new block takes):

* ``lru``: the block released longest ago; of one request's blocks the deepest first (vLLM frees a
  request's blocks tail first into its free queue). It approximately reproduces stock vLLM's hit
  tokens (vLLM allocates decode blocks as decoding goes, the replay at admission).
* ``belady``: the block whose next use (the next request start that would hit it) is furthest in the
  future, never-used-again first, the deepest first on ties. This is Bélády's MIN on the blocks the
  requests reference: with a running request's blocks pinned it is still optimal (pinned blocks are
  the ones referenced now), and a parent is never needed later than its child, so MIN keeps whole
  prefix chains and its per-block hits are chain hits. It is the offline optimum on this order:
  no policy hits more prompt tokens on these requests, in this pool, in this order.
* ``best_online``: the best a policy can do with what kvflow's hints carry. A hint names the call's
  fixed prefix (:attr:`Request.fixed` tokens: the agent's system prompt) and the workflow's order
  of agents (steps to execution), so a policy acting on hints knows which full blocks of each fixed
  prefix the next calls of each agent will read, and when, and nothing about any other block
  (dynamic parts, replies). The bound is MIN on a trace in which only those hinted blocks keep their
  identity: every block beyond a request's fixed prefix (or of a request without a hint) is made
  unique to that request, so it can never hit. MIN on that trace is the most hits any policy,
  online or offline, can get on the hinted blocks; on a single workflow with a fixed agent order
  the hints tell that future exactly, so an online policy can reach it (hence "best online"); with
  concurrent workflows it also knows the interleaving, which no online policy does, so it stays an
  upper bound. kvflow's hits can exceed it only by hitting blocks the hints do not name (a reply
  that a later prompt repeats, say); on traces where only fixed prefixes recur, ``best_online``
  equals ``belady``.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

__all__ = ["Request", "ReplayResult", "POLICIES", "block_replay", "block_bounds"]

POLICIES = ("lru", "belady", "best_online")
_NEVER = float("inf")


@dataclass(frozen=True)
class Request:
    """One recorded request: its prompt token ids, how many tokens it generated, the hinted fixed
    prefix in tokens (``None``: no hint), and when it started and finished (comparable stamps; by
    default, the requests run one after another in list order)."""

    prompt: Sequence[int]
    output: int = 0
    fixed: int | None = None
    start: Any = None
    end: Any = None


@dataclass
class ReplayResult:
    """Prompt tokens hit (``hits``) out of ``queries`` (every prompt token, vLLM's
    ``prefix_cache_queries``), per request in list order too."""

    hits: int = 0
    queries: int = 0
    per_request: list[int] = field(default_factory=list)


def _check(requests: Sequence[Request], blocks: int, block_size: int, policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"block_replay: unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_replay: block_size must be a positive integer, got {block_size!r}")
    if not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"block_replay: blocks must be a positive integer, got {blocks!r}")
    stamped = [r.start is not None for r in requests]
    if any(stamped) and not all(stamped):
        raise ValueError("block_replay: give every request start and end stamps, or none")
    for n, r in enumerate(requests):
        if not r.prompt:
            raise ValueError(f"block_replay: request {n} has an empty prompt")
        if r.output < 0:
            raise ValueError(f"block_replay: request {n} has a negative output count {r.output}")
        if r.start is not None and (r.end is None or r.end < r.start):
            raise ValueError(f"block_replay: request {n} ends before it starts (start {r.start}, end {r.end})")


def _timeline(requests: Sequence[Request]) -> list[tuple[int, int]]:
    """(kind, request) in time order: kind 0 = finish, 1 = start; a finish before a start at the
    same stamp (its blocks are free for the request that follows it)."""
    if not requests or requests[0].start is None:
        return [ev for n in range(len(requests)) for ev in ((1, n), (0, n))]
    stamped = [(r.start, 1, n) for n, r in enumerate(requests)] + [(r.end, 0, n) for n, r in enumerate(requests)]
    stamped.sort(key=lambda e: (e[0], e[1], e[2]))
    return [(kind, n) for _, kind, n in stamped]


class _Keys:
    """Interns block identities: a block is its tokens and its parent's identity (vLLM's chained hash)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}
        self._unique = itertools.count(-1, -1)  # identities no other block shares

    def unique(self) -> int:
        return next(self._unique)

    def chain(self, tokens: Sequence[int], block_size: int, named: int) -> list[int]:
        """Identities of the full blocks of ``tokens``; the ones from block ``named`` on are unique."""
        out: list[int] = []
        parent = 0
        for i in range(len(tokens) // block_size):
            if i >= named:
                out.append(self.unique())
                continue
            key = (parent, tuple(tokens[i * block_size:(i + 1) * block_size]))
            parent = self._ids.setdefault(key, len(self._ids) + 1)
            out.append(parent)
        return out


class _Pool:
    """Physical blocks: each empty or holding one identity, pinned by the running requests that hold it."""

    def __init__(self, blocks: int, policy: str, uses: dict[int, list[int]],
                 choose: Callable[[list[int]], int] | None) -> None:
        self.size, self.policy, self.uses, self.choose = blocks, policy, uses, choose
        self.empty = list(range(blocks - 1, -1, -1))  # content-free blocks, taken before any eviction
        self.key: dict[int, int] = {}  # physical block -> identity
        self.copies: dict[int, set[int]] = defaultdict(set)  # identity -> physical blocks holding it
        self.refs: dict[int, int] = defaultdict(int)
        self.depth: dict[int, int] = {}
        self.released: dict[int, Any] = {}  # evictable (cached, unpinned) block -> LRU rank

    def cached(self, key: int) -> bool:
        return bool(self.copies.get(key))

    def pin(self, key: int) -> int:
        phys = min(self.copies[key], key=lambda p: (p in self.released, p))  # share a pinned copy first
        self.released.pop(phys, None)
        self.refs[phys] += 1
        return phys

    def _next_use(self, key: int, now: int) -> float:
        at = self.uses.get(key, ())
        i = bisect.bisect_right(at, now)
        return at[i] if i < len(at) else _NEVER

    def _victim(self, now: int) -> int:
        if self.choose is not None:  # any policy at all: the tests search every choice for the optimum
            options = sorted(self.released)
            return options[self.choose(options)]
        if self.policy == "lru":
            return min(self.released, key=lambda p: self.released[p])
        # MIN: furthest next use first (a second copy of an identity is never needed), deepest on ties
        def rank(p: int) -> tuple[float, int, int]:
            key = self.key[p]
            spare = min(self.copies[key], key=lambda q: (q in self.released, q)) != p
            return (_NEVER if spare else self._next_use(key, now), self.depth[p], p)
        return max(self.released, key=rank)

    def take(self, now: int) -> int:
        if self.empty:
            phys = self.empty.pop()
        elif self.released:
            phys = self._victim(now)
            del self.released[phys]
            self.copies[self.key.pop(phys)].discard(phys)
        else:
            raise ValueError(f"block_replay: the running requests need more than the pool's {self.size} blocks")
        self.refs[phys] = 1
        return phys

    def name(self, phys: int, key: int, depth: int) -> None:
        self.key[phys], self.depth[phys] = key, depth
        self.copies[key].add(phys)

    def release(self, phys: int, rank: Any) -> None:
        self.refs[phys] -= 1
        if self.refs[phys]:
            return
        if phys in self.key:
            self.released[phys] = rank
        else:
            self.empty.append(phys)


def block_replay(requests: Sequence[Request], blocks: int, block_size: int, policy: str = "lru") -> ReplayResult:
    """Replay ``requests`` on a prefix cache of ``blocks`` blocks of ``block_size`` tokens under
    ``policy`` (see the module docstring). Raises ValueError on bad input, or when running requests
    need more blocks than the pool has (vLLM would queue them; this replay follows the recorded order)."""
    return _replay(requests, blocks, block_size, policy, None)


def _replay(requests: Sequence[Request], blocks: int, block_size: int, policy: str,
            choose: Callable[[list[int]], int] | None) -> ReplayResult:
    """:func:`block_replay`; ``choose`` (given the evictable blocks, the index of the one to evict)
    replaces the policy's choice."""
    _check(requests, blocks, block_size, policy)
    keys = _Keys()
    chains: list[list[int]] = []  # per request: identities of its full prompt blocks
    for r in requests:
        named = len(r.prompt) if policy != "best_online" else min(r.fixed or 0, len(r.prompt))
        chains.append(keys.chain(r.prompt, block_size, named // block_size))
    timeline = _timeline(requests)
    uses: dict[int, list[int]] = defaultdict(list)  # identity -> timeline positions that look it up
    for pos, (kind, n) in enumerate(timeline):
        if kind == 1:
            for key in chains[n][:(len(requests[n].prompt) - 1) // block_size]:
                uses[key].append(pos)
    pool = _Pool(blocks, policy, uses, choose)
    held: dict[int, list[int]] = {}
    result = ReplayResult(per_request=[0] * len(requests))
    for pos, (kind, n) in enumerate(timeline):
        r, chain = requests[n], chains[n]
        computed = len(r.prompt) + max(r.output - 1, 0)  # vLLM never computes the last sampled token
        if kind == 1:
            cap = min((len(r.prompt) - 1) // block_size, len(chain))
            hit = 0
            while hit < cap and pool.cached(chain[hit]):
                hit += 1
            result.per_request[n] = hit * block_size
            result.hits += hit * block_size
            result.queries += len(r.prompt)
            mine = [pool.pin(key) for key in chain[:hit]]
            for d in range(hit, -(-computed // block_size)):
                phys = pool.take(pos)
                if d < len(chain):  # a full prompt block: cached once prefilled, as vLLM does
                    pool.name(phys, chain[d], d)
                mine.append(phys)
            held[n] = mine
        else:
            mine = held.pop(n)
            for d, phys in enumerate(mine):
                if len(chain) <= d < computed // block_size:  # a full block of generated tokens
                    pool.name(phys, keys.unique(), d)
            for d, phys in reversed(list(enumerate(mine))):
                pool.release(phys, (pos, -d))  # LRU: released longest ago, a request's deepest first
    return result


def block_bounds(requests: Iterable[Request], blocks: int, block_size: int) -> dict[str, int]:
    """Prompt tokens (``prompt``) and hit tokens under every policy of :data:`POLICIES`."""
    reqs = list(requests)
    out = {"prompt": sum(len(r.prompt) for r in reqs)}
    for policy in POLICIES:
        out[policy] = block_replay(reqs, blocks, block_size, policy).hits
    return out
