"""Tokenizer: byte-level round trip, chat template, a fixed prefix whose ids never depend on the
dynamic part, clear errors for malformed messages, and UTF-8-safe streaming deltas."""

from __future__ import annotations

import random

import pytest

from backends.local.tokenizer import IncrementalDecoder

SYSTEM = {"role": "system", "content": "You are a meticulous reviewer. Check every claim twice."}


def test_byte_level_round_trip(tiny):
    text = "naïve café — 東京 🚀 <|im_end|> done"
    ids = tiny.tokenizer.encode(text)
    assert tiny.tokenizer.decode(ids) == text.replace("<|im_end|>", "")
    assert tiny.tokenizer.token_id("<|im_end|>") in ids  # special tokens are single ids


def test_chat_template_is_chatml(tiny):
    text = tiny.tokenizer.render_chat([SYSTEM, {"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == (f"<|im_start|>system\n{SYSTEM['content']}<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_fixed_prefix_ids_are_stable_across_requests(tiny):
    a = tiny.tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "first question"}], fixed_messages=1)
    b = tiny.tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "another, longer question"}], fixed_messages=1)
    n = a.fixed_prefix_tokens
    assert n == b.fixed_prefix_tokens and n is not None and n > 0
    assert a.input_ids[:n] == b.input_ids[:n]
    assert tiny.tokenizer.decode(a.input_ids[:n]) == f"system\n{SYSTEM['content']}\n"  # specials skipped
    assert tiny.tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "x"}]).fixed_prefix_tokens is None


def test_text_prompt_boundary_in_characters(tiny):
    enc = tiny.tokenizer.encode_text("ROLE PROMPT. question?", fixed_chars=12)
    assert tiny.tokenizer.decode(enc.input_ids[: enc.fixed_prefix_tokens]) == "ROLE PROMPT."


@pytest.mark.parametrize(
    ("messages", "fixed", "match"),
    [
        ([], None, "must not be empty"),
        (["hello"], None, r"messages\[0\] must be an object"),
        ([{"role": "", "content": "x"}], None, r"messages\[0\].role"),
        ([{"role": "user", "content": 3}], None, r"messages\[0\].content"),
        ([{"role": "user", "content": "x"}], 2, "fixed_prefix is 2 but the request has 1 messages"),
    ],
)
def test_malformed_chat_is_a_clear_error(tiny, messages, fixed, match):
    with pytest.raises(ValueError, match=match):
        tiny.tokenizer.encode_chat(messages, fixed_messages=fixed)


def test_incremental_decoder_never_splits_a_character(tiny):
    text = "ok 🚀 東京!"
    decoder = IncrementalDecoder(tiny.tokenizer)
    deltas = [decoder.push(i) for i in tiny.tokenizer.encode(text)]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_incremental_decoder_matches_a_full_decode_on_any_ids(tiny):
    # random ids mix specials, ASCII and stray UTF-8 bytes: the windowed decode must still add up exactly
    rng = random.Random(7)
    for _ in range(200):
        ids = [rng.randrange(tiny.tokenizer.vocab_size) for _ in range(rng.randrange(1, 40))]
        decoder = IncrementalDecoder(tiny.tokenizer)
        text = "".join(decoder.push(i) for i in ids)
        full = tiny.tokenizer.decode(ids)
        assert text == full or full.endswith("\ufffd") and full.startswith(text)
