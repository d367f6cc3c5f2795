"""Prompt texts of the bundled workflows: the filler has the exact SmolLM2 token length it promises,
is deterministic, and the MetaGPT role prompts have realistic, distinct lengths (500-1,500 tokens)."""

from __future__ import annotations

import pytest

from workflows._filler import WORDS, filler
from workflows.metagpt_roles import ROLES
from workflows.synthetic import synthetic


def test_every_filler_word_is_one_token(smollm2_tokenizer):
    for word in WORDS:
        assert len(smollm2_tokenizer.encode(word)) == 1, word
        assert len(smollm2_tokenizer.encode(" " + word)) == 1, word


@pytest.mark.parametrize("n", [0, 1, 2, 3, 15, 32, 257, 4096])
@pytest.mark.parametrize("seed", [0, "agent-3", ("dynamic", "s01", 2)])
def test_filler_has_exact_smollm2_length(smollm2_tokenizer, n, seed):
    assert len(smollm2_tokenizer.encode(filler(n, seed))) == n


def test_filler_is_deterministic_and_seeded():
    assert filler(300, "x") == filler(300, "x")
    assert filler(300, "x") != filler(300, "y")
    assert filler(300, "x").startswith(filler(300, "x").split(".")[0])
    with pytest.raises(ValueError, match="n_tokens"):
        filler(-1)


def test_synthetic_prompts_have_requested_lengths(smollm2_tokenizer):
    wf = synthetic(n_agents=3, fixed=700, dynamic=40, output=8, rounds=1, branches=2)
    asg = wf.compile()
    systems = {agent: asg.system_prompt(agent) for agent in asg.agents}
    assert all(len(smollm2_tokenizer.encode(s)) == 700 for s in systems.values())
    # variants of a stage share the first half of their fixed prompt, stages share nothing
    a, b, c = systems["s00_b0"], systems["s00_b1"], systems["s01_b0"]
    half = len(filler(350, ("shared", 0)))
    assert a[:half] == b[:half] and a[half:] != b[half:]
    assert a[:40] != c[:40]


def test_synthetic_apps_have_fixed_prompts_of_their_own(smollm2_tokenizer):
    # the paper's independent concurrent workflows: same shape, no shared cache prefix between apps
    def systems(**kw):
        asg = synthetic(n_agents=2, fixed=300, rounds=1, **kw).compile()
        return asg.name, [asg.system_prompt(agent) for agent in asg.agents]

    (plain, base), (name_a, a), (name_b, b) = systems(), systems(app="a"), systems(app="b")
    assert systems(app="") == (plain, base)  # the default keeps the shared prompts
    assert len({plain, name_a, name_b}) == 3
    assert all(len(smollm2_tokenizer.encode(s)) == 300 for s in a + b)
    assert all(x[:40] != y[:40] for x, y in zip(base + a, a + b, strict=True))
    assert systems(app="a") == (name_a, a)


def testmetagpt_roles_are_realistic_and_distinct(smollm2_tokenizer):
    lengths = {role: len(smollm2_tokenizer.encode(text)) for role, text in ROLES.items()}
    assert all(500 <= n <= 1500 for n in lengths.values()), lengths
    openings = {text.split(".")[0] for text in ROLES.values()}
    assert len(openings) == len(ROLES)
    prefixes = {text[:60] for text in ROLES.values()}
    assert len(prefixes) == len(ROLES)  # no shared cache prefix between agents
