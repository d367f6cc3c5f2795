"""The block-granular replay (backends/kvcache/block_replay.py): vLLM's prefix-cache rules on tiny
traces with hit counts worked out by hand, and its bounds checked against every eviction choice
there is (an exhaustive search) on small random traces."""

from __future__ import annotations

import random

import pytest

from backends.kvcache.block_replay import POLICIES, Request, _replay, block_bounds, block_replay

B = 4  # block size of the hand-checked traces


def _prompt(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def test_partial_blocks_never_hit_and_the_last_prompt_token_is_always_computed():
    for policy in POLICIES:
        # 7 tokens: one full block (4) and a partial one; the repeat hits the full block only
        assert block_replay([Request(_prompt(1, 7), 1, 7)] * 2, 8, B, policy).per_request == [0, 4]
        # 3 tokens: no full block, nothing to hit
        assert block_replay([Request(_prompt(1, 3), 1, 3)] * 2, 8, B, policy).hits == 0
        # 8 tokens = two full blocks, but vLLM computes the last token: the repeat hits one block
        assert block_replay([Request(_prompt(1, 8), 1, 8)] * 2, 8, B, policy).per_request == [0, 4]


def test_a_block_hits_only_under_its_whole_prefix():
    a = Request(_prompt(1, 9), 1, 9)
    same_tail = Request(_prompt(2, 4) + _prompt(1, 9)[4:], 1, 9)  # block 1 equal to a's, block 0 not
    assert block_replay([a, same_tail], 16, B).per_request == [0, 0]
    shared_head = Request(_prompt(1, 4) + _prompt(3, 5), 1, 9)  # block 0 equal to a's
    assert block_replay([a, shared_head], 16, B).per_request == [0, 4]


def test_lru_and_belady_on_a_cycle_larger_than_the_pool():
    # each call: 9 prompt tokens + 1 generated = 3 blocks held, 2 of them full prompt blocks cached
    a, b, c = (Request(_prompt(t, 9), 1, 8) for t in (1, 2, 3))
    trace = [a, b, c, a]
    # pool 5: after a and b, 4 cached blocks + 1 empty; c takes the empty one and evicts two.
    # LRU evicts a's (released first, its deepest first): a's repeat hits nothing.
    assert block_replay(trace, 5, B, "lru").per_request == [0, 0, 0, 0]
    # Bélády evicts b's (never used again): a's repeat hits both full blocks (8 tokens)
    assert block_replay(trace, 5, B, "belady").per_request == [0, 0, 0, 8]
    assert block_replay(trace, 5, B, "best_online").per_request == [0, 0, 0, 8]
    # a pool that holds everything: every policy hits a's two blocks
    assert {block_replay(trace, 9, B, p).hits for p in POLICIES} == {8}


def test_best_online_counts_only_the_blocks_the_hint_names():
    a = Request(_prompt(1, 9), 1, 4)  # the hint names a's first block only
    b, c = (Request(_prompt(t, 9), 1, 8) for t in (2, 3))
    trace = [a, b, c, a]
    assert block_replay(trace, 9, B, "belady").per_request[3] == 8
    assert block_replay(trace, 9, B, "best_online").per_request[3] == 4
    unhinted = Request(_prompt(1, 9), 1, None)
    assert block_replay([unhinted, unhinted], 9, B, "best_online").hits == 0
    assert block_replay([unhinted, unhinted], 9, B, "belady").hits == 8


def test_concurrent_requests_share_blocks_and_hold_them_until_they_finish():
    a = _prompt(1, 9)
    # the second starts while the first runs: the first's prompt blocks are cached once prefilled
    overlap = [Request(a, 1, 8, start=0, end=2), Request(a, 1, 8, start=1, end=3)]
    assert block_replay(overlap, 6, B).per_request == [0, 8]
    # two running calls hold 6 blocks: a 5-block pool cannot run them side by side
    other = [Request(a, 1, 8, start=0, end=2), Request(_prompt(2, 9), 1, 8, start=1, end=3)]
    with pytest.raises(ValueError, match="more than the pool's 5 blocks"):
        block_replay(other, 5, B)
    # a finished call's blocks are evictable, a running call's are not: with b running (3 blocks),
    # c finds a's 2 cached blocks to evict and needs 3
    later = [Request(a, 1, 8, start=0, end=1), Request(_prompt(2, 9), 1, 8, start=2, end=5),
             Request(_prompt(3, 9), 1, 8, start=3, end=4)]
    assert block_replay(later, 6, B).per_request == [0, 0, 0]
    with pytest.raises(ValueError, match="more than the pool's 5 blocks"):
        block_replay(later, 5, B)


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="unknown policy 'fifo'"):
        block_replay([Request([1, 2, 3])], 4, B, "fifo")
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        block_replay([Request([1, 2, 3])], 4, 0)
    with pytest.raises(ValueError, match="blocks must be a positive integer"):
        block_replay([Request([1, 2, 3])], 0, B)
    with pytest.raises(ValueError, match="empty prompt"):
        block_replay([Request([])], 4, B)
    with pytest.raises(ValueError, match="start and end stamps, or none"):
        block_replay([Request([1], start=0, end=1), Request([1])], 4, B)
    with pytest.raises(ValueError, match="ends before it starts"):
        block_replay([Request([1], start=2, end=1)], 4, B)


def _follow(trace: list[Request], blocks: int, prefix: list[int]) -> tuple[int, list[int], list[tuple[int, int]]]:
    """One replay making the choices of ``prefix``, then always the first option: its hits, the
    choices made, and (choice, options) where it went past ``prefix``."""
    made: list[int] = []
    fresh: list[tuple[int, int]] = []

    def choose(options: list[int]) -> int:
        i = len(made)
        if i >= len(prefix):
            fresh.append((i, len(options)))
        made.append(prefix[i] if i < len(prefix) else 0)
        return made[-1]

    return _replay(trace, blocks, B, "lru", choose).hits, made, fresh


def _optimum(trace: list[Request], blocks: int) -> int:
    """The most hit tokens any eviction order gets: every sequence of choices, tried."""
    best, pending = 0, [[]]
    while pending:
        hits, made, fresh = _follow(trace, blocks, pending.pop())
        best = max(best, hits)
        pending.extend(made[:i] + [alt] for i, n in fresh for alt in range(1, n))
    return best


def _random_trace(rng: random.Random, calls: int, concurrent: bool) -> list[Request]:
    """Three agents whose prompts are a system head (1-2 full blocks) and a tail of their own per call;
    concurrent: calls start about 2 apart and run 1 or 2.5, so some overlap."""
    heads = {agent: _prompt(agent, rng.choice((5, 8, 9))) for agent in range(1, 4)}
    trace = []
    for n in range(calls):
        agent = rng.randrange(1, 4)
        start = n * 2 + (rng.random() if concurrent else 0)
        trace.append(Request(heads[agent] + _prompt(100 + n, rng.randrange(0, 3)), 1, len(heads[agent]),
                             start, start + (rng.choice((1, 2.5)) if concurrent else 1)))
    return trace


@pytest.mark.parametrize("concurrent", [False, True])
def test_belady_is_the_optimum_and_bounds_lru_and_best_online(concurrent):
    rng = random.Random(27 + concurrent)
    checked = lru_short = 0
    for _ in range(60):
        trace = _random_trace(rng, rng.randrange(5, 8), concurrent)
        blocks = rng.randrange(4, 7)
        try:
            got = block_bounds(trace, blocks, B)
        except ValueError:  # the running calls do not fit this pool
            continue
        assert got["lru"] <= got["belady"] and got["best_online"] <= got["belady"] <= got["prompt"]
        assert all(got[p] % B == 0 for p in POLICIES)
        assert got["belady"] == _optimum(trace, blocks)
        checked += 1
        lru_short += got["lru"] < got["belady"]
    assert checked >= 30 and lru_short >= 3  # traces on which the eviction order matters


def test_belady_is_at_least_lru_on_larger_random_traces():
    rng = random.Random(5)
    for _ in range(40):
        trace = _random_trace(rng, 30, concurrent=rng.random() < 0.5)
        got = block_bounds(trace, rng.randrange(8, 14), B)
        assert got["lru"] <= got["belady"] and got["best_online"] <= got["belady"]
