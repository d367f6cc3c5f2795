"""Every sampling option changes what it should: the sampler on hand-made logits (bias, presence /
frequency / repetition penalties, top-k, min-p, log-probabilities), and the engine on tiny-random
(logprobs identical cold and on a cache hit, unseeded sampling seeded per process)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from backends.base import SamplingParams
from backends.local.sampler import make_generator, sample, shape_logits, token_logprob
from test_local_engine import assert_no_leak, chat, make_engine

LOGITS = torch.tensor([2.0, 1.0, -1.0, 0.5, 0.0])


def test_logit_bias_is_added_to_its_token() -> None:
    shaped = shape_logits(LOGITS, SamplingParams(logit_bias={2: 5.0, 0: -100.0}), (), ())
    assert shaped.tolist() == pytest.approx([-98.0, 1.0, 4.0, 0.5, 0.0])
    assert sample(shaped, SamplingParams(temperature=0), None) == 2


def test_presence_and_frequency_penalties_count_the_output_only() -> None:
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    shaped = shape_logits(LOGITS, params, prompt=(3, 3, 3), outputs=(0, 0, 1))
    assert shaped.tolist() == pytest.approx([2.0 - 0.5 - 0.5, 1.0 - 0.5 - 0.25, -1.0, 0.5, 0.0])


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_prompt_and_output() -> None:
    shaped = shape_logits(LOGITS, SamplingParams(repetition_penalty=2.0), prompt=(0,), outputs=(2,))
    assert shaped.tolist() == pytest.approx([1.0, 1.0, -2.0, 0.5, 0.0])


def test_extreme_penalty_stays_finite_and_samples() -> None:
    params = SamplingParams(temperature=1.0, repetition_penalty=5e-324)
    shaped = shape_logits(LOGITS, params, prompt=(0, 1, 3), outputs=())
    assert torch.isfinite(shaped).all()
    assert sample(shaped, params, make_generator(params, 0)) in range(5)


def test_unshaped_logits_are_returned_as_they_are() -> None:
    assert shape_logits(LOGITS, SamplingParams(), (0,), (1,)) is LOGITS


@pytest.mark.parametrize("option", [{"top_k": 1}, {"min_p": 0.99}])
def test_top_k_one_and_min_p_near_one_always_pick_the_top_token(option) -> None:
    params = SamplingParams(temperature=2.0, **option)
    gen = make_generator(params, 7)
    assert {sample(LOGITS, params, gen) for _ in range(200)} == {0}
    unrestricted = SamplingParams(temperature=2.0)
    gen = make_generator(unrestricted, 7)
    assert len({sample(LOGITS, unrestricted, gen) for _ in range(200)}) > 1


def test_top_k_two_never_leaves_the_two_best() -> None:
    params = SamplingParams(temperature=5.0, top_k=2)
    gen = make_generator(params, 3)
    assert {sample(LOGITS, params, gen) for _ in range(300)} == {0, 1}


def test_token_logprob_is_the_models_log_softmax_with_the_best_alternatives() -> None:
    entry = token_logprob(LOGITS, 3, top=2)
    expected = torch.log_softmax(LOGITS.double(), -1)
    assert entry.token_id == 3 and entry.logprob == pytest.approx(float(expected[3]))
    assert [t for t, _ in entry.top] == [0, 1]
    assert math.fsum(math.exp(lp) for lp in expected.tolist()) == pytest.approx(1.0)


async def test_logprobs_are_the_same_cold_and_on_a_cache_hit() -> None:
    eng = make_engine()
    try:
        base = chat(eng, "planner", "Plan a birthday party.", steps={"planner": 0})
        request = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, logprobs=3))
        cold = await eng.generate(request)
        hit = await eng.generate(dataclasses.replace(request, request_id="again"))
        assert cold.cached_tokens == 0 and hit.cached_tokens > 0
        assert hit.output_ids == cold.output_ids
        assert len(cold.logprobs) == len(cold.output_ids)
        for a, b in zip(cold.logprobs, hit.logprobs, strict=True):
            assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-5)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            # greedy: the chosen token is the most likely one
            assert a.top[0][0] == a.token_id and a.top[0][1] == pytest.approx(a.logprob)
        plain = await eng.generate(dataclasses.replace(base, request_id="plain"))
        assert plain.logprobs is None and plain.output_ids == cold.output_ids
        assert_no_leak(eng)
    finally:
        eng.close()


async def test_logit_bias_forces_a_token_end_to_end() -> None:
    eng = make_engine()
    try:
        base = chat(eng, "coder", "Write a loop.", max_tokens=6)
        biased = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, logit_bias=((42, 100.0),)))
        assert (await eng.generate(biased)).output_ids == (42,) * 6
    finally:
        eng.close()


def _sampled(eng, seed=None):
    base = chat(eng, "critic", "Find the bug.", max_tokens=16)
    return dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, temperature=1.0, seed=seed))


async def test_unseeded_sampling_differs_per_process_and_from_small_explicit_seeds() -> None:
    # Before, the k-th unseeded request used seed k: identical on every restart, and equal to a
    # user's explicit seed=1 for the first request.
    first, second = make_engine(), make_engine()
    try:
        a = await first.generate(_sampled(first))
        b = await second.generate(_sampled(second))
        assert a.output_ids != b.output_ids
        explicit = {(await first.generate(_sampled(first, seed=k))).output_ids for k in range(1, 4)}
        assert a.output_ids not in explicit
        # an explicit seed stays reproducible across engines
        seeded = await first.generate(_sampled(first, 9))
        assert seeded.output_ids == (await second.generate(_sampled(second, 9))).output_ids
    finally:
        first.close()
        second.close()
