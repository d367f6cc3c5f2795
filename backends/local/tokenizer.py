"""Prompt tokenizer: a ``tokenizers.Tokenizer`` plus the model's chat template and a stable
fixed/dynamic boundary.

The fixed part of a chat (the first ``fixed_messages`` messages, the agent's role prompt) is
rendered and tokenized on its own, then the rest is appended: the fixed part's token ids never
depend on what follows, so every request of an agent shares them exactly (a radix-tree hit).
"""

from __future__ import annotations

from typing import Any, Sequence

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from backends.base import EncodedPrompt

__all__ = ["ChatTokenizer", "CHATML_TEMPLATE", "byte_level_tokenizer", "IncrementalDecoder"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _raise(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def byte_level_tokenizer() -> Tokenizer:
    """A 259-token byte-level tokenizer (3 ChatML specials, then the 256 byte symbols); no merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(CHATML_SPECIALS)}
    vocab.update({ch: len(CHATML_SPECIALS) + i for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in CHATML_SPECIALS])
    return tok


class ChatTokenizer:
    """Implements ``backends.base.PromptTokenizer``."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, eos_token_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template or CHATML_TEMPLATE
        self.eos_token_ids = frozenset(eos_token_ids)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(self.chat_template)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids if text else []

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages: Sequence[dict[str, Any]], fixed_messages: int | None = None) -> EncodedPrompt:
        _check_messages(messages)
        full = self.render_chat(messages, add_generation_prompt=True)
        if fixed_messages is None:
            return EncodedPrompt(tuple(self.encode(full)))
        if not 0 <= fixed_messages <= len(messages):
            raise ValueError(f"fixed_prefix is {fixed_messages} but the request has {len(messages)} messages")
        fixed = self.render_chat(messages[:fixed_messages], add_generation_prompt=False) if fixed_messages else ""
        if not full.startswith(fixed):
            # a template that rewrites earlier messages depending on later ones: no stable boundary
            return EncodedPrompt(tuple(self.encode(full)))
        return self._split(full, len(fixed))

    def encode_text(self, text: str, fixed_chars: int | None = None) -> EncodedPrompt:
        if not isinstance(text, str):
            raise ValueError("prompt must be a string")
        if fixed_chars is None:
            return EncodedPrompt(tuple(self.encode(text)))
        if not 0 <= fixed_chars <= len(text):
            raise ValueError(f"fixed_prefix is {fixed_chars} characters but the prompt has {len(text)}")
        return self._split(text, fixed_chars)

    def _split(self, text: str, boundary: int) -> EncodedPrompt:
        head = self.encode(text[:boundary])
        return EncodedPrompt(tuple(head + self.encode(text[boundary:])), len(head))


def _check_messages(messages: Sequence[dict[str, Any]]) -> None:
    if not messages:
        raise ValueError("messages must not be empty")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        if not isinstance(message.get("role"), str) or not message["role"]:
            raise ValueError(f"messages[{i}].role must be a non-empty string")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"messages[{i}].content must be a string")


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas, holding back incomplete UTF-8 sequences.

    Each push decodes only a short window, not every id so far (that is quadratic in the output
    length): the ids since the last delta plus the chunk before them, whose text is subtracted. That
    chunk starts and ends on character boundaries, and keeping it as context lets decoders that
    treat the first token specially (a leading space) give the same text as decoding everything.
    """

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._context = 0  # the window starts here: ids before it are emitted and need no re-decoding
        self._emitted = 0  # ids[:_emitted] are emitted text

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids[self._context:])
        if text.endswith("\ufffd"):
            return ""
        seen = self._tokenizer.decode(self._ids[self._context:self._emitted])
        self._context, self._emitted = self._emitted, len(self._ids)
        return text[len(seen):]
