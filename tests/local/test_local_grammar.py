"""Constrained decoding in the embedded engine (tiny-random, a random model: the worst case for
finishing a reply): a constrained reply validates at every budget down to the shortest complete one,
one token less is truncated and ends on ``length`` (as OpenAI truncates), and constrained requests
return every slot."""

from __future__ import annotations

import json

import jsonschema
import pytest

from backends.base import Constraint, GenerateRequest, SamplingParams
from backends.local import Engine, EngineConfig
from backends.local.grammar import Grammars

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 2, "maxLength": 12},
        "n": {"type": "integer"},
        "ok": {"type": "boolean"},
        "items": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "number"}},
                                             "required": ["k"]}, "minItems": 1},
    },
    "required": ["title", "n", "ok", "items"],
}
PROMPTS = ["Describe a cat.", "x", "List three colours and then stop.", "{\"title\": \""]


@pytest.fixture(scope="module")
def engine():
    eng = Engine(EngineConfig.build(model="tiny-random", device_tokens=2048, host_tokens=2048))
    yield eng
    eng.close()


def request(engine, prompt: str, max_tokens: int, constraint: Constraint, **sampling) -> GenerateRequest:
    return GenerateRequest(tuple(engine.tokenizer.encode(prompt)), SamplingParams(max_tokens=max_tokens, **sampling),
                           constraint=constraint)


def minimum(engine, constraint: Constraint) -> int:
    return Grammars(engine.tokenizer, engine.model_config.vocab_size).start(constraint).closing_length()


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("extra", [0, 1, 5, 40, 200])
async def test_constrained_reply_validates_at_every_budget(engine, prompt, extra):
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    budget = minimum(engine, constraint) + extra
    for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "seed": extra}):
        result = await engine.generate(request(engine, prompt, budget, constraint, **sampling))
        assert result.finish_reason == "stop" and len(result.output_ids) <= budget
        jsonschema.validate(json.loads(result.text), SCHEMA)


async def test_budget_one_short_of_the_minimum_is_truncated_on_length(engine):
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    short = minimum(engine, constraint) - 1
    result = await engine.generate(request(engine, "hi", short, constraint))
    assert result.finish_reason == "length" and len(result.output_ids) == short  # the stop token did not fit
    assert engine.stats()["device_held"] == 0


async def test_unconstrained_greedy_output_is_unchanged_after_constrained_requests(engine):
    plain = GenerateRequest(tuple(engine.tokenizer.encode("Describe a cat.")), SamplingParams(max_tokens=16))
    before = (await engine.generate(plain)).output_ids
    await engine.generate(request(engine, "Describe a cat.", 64, Constraint("json_object")))
    assert (await engine.generate(plain)).output_ids == before
    stats = engine.stats()
    assert stats["device_held"] == 0 and stats["running"] == 0


@pytest.mark.parametrize("escape,accepted", [("\\u00e9", True), ("\\ud7ff", True), ("\\ue000", True),
                                             ("\\udfcb", False), ("\\uD800", False)])
def test_string_escapes_stop_short_of_lone_surrogates(engine, escape, accepted):
    """A lone surrogate escape is JSON but no text: a client re-encoding the string would fail."""
    import xgrammar as xgr

    constraint = Constraint("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "string"}},
                                                       "required": ["a"]}))
    matcher = xgr.GrammarMatcher(Grammars(engine.tokenizer, engine.model_config.vocab_size).compile(constraint))
    assert matcher.accept_string('{"a":"x' + escape + '"}') is accepted


def _one_allowed_character(raw: bytes) -> bool:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return len(text) == 1 and ((" " <= text <= "\x7f" and text not in '"\\') or ord(text) >= 0x100)


def test_bounded_string_takes_a_byte_sequence_only_when_it_is_one_character(engine):
    """xgrammar's byte matcher reads loose UTF-8 in a character range that crosses a lead byte's
    boundary (the overlong E0 80 80 passed as one character and decoded as three U+FFFD, a maxLength
    overrun): every lead byte with the second bytes around each limit, against Python's decoder."""
    import xgrammar as xgr

    constraint = Constraint("json_schema", json.dumps({"type": "object", "required": ["a"],
                                                       "properties": {"a": {"type": "string", "maxLength": 3}}}))
    compiled = Grammars(engine.tokenizer, engine.model_config.vocab_size).compile(constraint)
    edges = (0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0)
    sequences = [bytes([a]) for a in range(256)]
    sequences += [bytes([a, b]) for a in range(0xC0, 0x100) for b in edges]
    sequences += [bytes([a, b, 0x80]) for a in range(0xE0, 0xF0) for b in edges]
    sequences += [bytes([a, b, 0x80, 0x80]) for a in range(0xF0, 0xF8) for b in edges]
    wrong = [raw.hex() for raw in sequences
             if xgr.GrammarMatcher(compiled).accept_string(b'{"a":"' + raw + b'"}') != _one_allowed_character(raw)]
    assert wrong == []
