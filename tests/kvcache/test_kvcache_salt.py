"""Salted keys (a request's ``cache_salt``): prompts under different salts, or salted and unsalted,
share no node of the tree; under one salt they share as before, tags and host copies included."""

from __future__ import annotations

from backends.kvcache import AgentRequest, IntakeDecision, salted_key
from kvflow_orch.protocol import KVFlowHint

PROMPT = tuple(range(10, 30))
PLAIN = IntakeDecision(None)  # an unhinted request: nothing tagged


def _run(cache, prompt, n_out=2, intake=PLAIN):
    r = cache.reserve(prompt, n_out)
    cache.release(r, prompt + (1,) * (n_out - 1), intake)
    return r.reused


def test_salted_keys_differ_from_every_token_and_from_other_salts() -> None:
    assert salted_key(PROMPT, None) == PROMPT and salted_key((), "s") == ()
    a, b = salted_key(PROMPT, "a"), salted_key(PROMPT, "b")
    assert a[1:] == b[1:] == PROMPT[1:]  # only the root's edge differs: a radix tree shares from the root
    assert a[0] < 0 and b[0] < 0 and a[0] != b[0]
    assert salted_key(PROMPT, "a") == a  # stable: the same salt finds its own prefixes again
    assert salted_key(PROMPT[:5], "a") == a[:5]  # a prefix's key is the key's prefix


def test_different_salts_share_no_cached_token(make_cache) -> None:
    cache = make_cache(device_tokens=256)
    assert _run(cache, salted_key(PROMPT, "a")) == 0
    assert _run(cache, salted_key(PROMPT, "a")) == len(PROMPT) - 1  # one salt: reused as before
    assert _run(cache, salted_key(PROMPT, "b")) == 0
    assert _run(cache, PROMPT) == 0
    assert cache.match_prefix(salted_key(PROMPT + (99,), "c")).cached_tokens == 0
    assert cache.match_prefix(PROMPT + (99,)).cached_tokens == len(PROMPT)  # unsalted shares with itself
    cache.check_integrity()


def test_a_salted_agents_fixed_prefix_is_tagged_under_its_salt(make_cache) -> None:
    cache = make_cache(device_tokens=256)
    key = salted_key(PROMPT, "tenant")
    hint = KVFlowHint(workflow_id="w", agent="coder", steps={"coder": 1})
    decision = cache.accept(AgentRequest(key, hint, 10))
    assert decision[:2] == (("default", "coder"), 10)
    _run(cache, key, intake=decision)
    assert cache.fixed_prefix(("default", "coder")) == key[:10]  # prefetch would load the salted path
    assert cache.match_prefix(PROMPT).cached_tokens == 0
    tagged = [node for node in cache.tree if node.tags]
    assert tagged and all(cache.tree.path_to(node)[0].key[0] == key[0] for node in tagged)
    cache.check_integrity()
