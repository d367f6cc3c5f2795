"""Constrained decoding with xgrammar: a :class:`~backends.base.Constraint` becomes a per-request
token mask, applied to each step's logits before sampling.

Budget: a reply should finish within ``max_tokens``. :class:`Grammars.start` computes a way to finish
from the empty reply (the *closing path*: jump-forward strings, then the first allowed of ``EOS } ]
" 0 , :`` ... at each step). While decoding, :meth:`TokenGrammar.advance` keeps the model's token only
if the closing path from the state it leads to still fits in what is left; otherwise it takes the
closing path's next token. So a constrained reply whose closing path fits always ends complete
(``finish_reason`` ``stop``), even from a random model. One whose ``max_tokens`` is shorter than the
shortest way to finish is truncated there and ends on ``length``, as OpenAI truncates (the reply is a
prefix of a valid one); so is a grammar whose closing path this search cannot find (e.g. a regex
that no short string of those characters satisfies), decoded best effort. A grammar that allows no
first token at all (it accepts nothing) is refused up front with a :class:`ConstraintError`.

JSON is generated compact (no free whitespace): a model cannot spend its budget on blank lines.
"""

from __future__ import annotations

import json
import re
import threading
from typing import TYPE_CHECKING, Any

import torch

from backends.base import Constraint, ConstraintError, EngineError
from backends.local.tokenizer import ChatTokenizer

if TYPE_CHECKING:
    import xgrammar

__all__ = ["Grammars", "TokenGrammar"]

_CLOSING_CHARS = '"}]0,:tfn[{1 '
"""Characters the closing path prefers, in order: close what is open, then the shortest values."""
_MAX_CLOSING = 512
_XGRAMMAR_LOG_HEAD = re.compile(r"^\s*\[[0-9:.]+\]\s+\S+?:\d+:\s*(Warning:\s*)?")
"""xgrammar's log prefix on its exception messages (a timestamp and its C++ source file and line)."""
_CHECK_MARGIN = 64
"""The model's own token is checked against the budget once fewer than this many tokens (plus the
last closing length, times two) are left; before that one token cannot exhaust the budget."""


class Grammars:
    """Compiles constraints for one tokenizer (xgrammar's compiler caches them). Thread-safe; the
    first use imports xgrammar (a second or two)."""

    def __init__(self, tokenizer: ChatTokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._lock = threading.Lock()
        self._compiler: Any = None
        self._closing_ids: list[int] = []

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr
                from transformers import PreTrainedTokenizerFast

                tok = self._tokenizer.tokenizer
                hf = PreTrainedTokenizerFast(tokenizer_object=tok)
                info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self._vocab_size,
                                                          stop_token_ids=sorted(self._tokenizer.eos_token_ids))
                # Special tokens (ChatML markers, ...) decode to nothing: an empty entry tells xgrammar
                # they are not text, so the grammar never lets one into a reply.
                specials = {i for i, added in tok.get_added_tokens_decoder().items() if added.special}
                vocab = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
                encoded = [""] * self._vocab_size
                for text, i in vocab:
                    if i < self._vocab_size and i not in specials:
                        encoded[i] = text
                info = xgr.TokenizerInfo.from_vocab_and_metadata(encoded, info.dump_metadata())
                self._closing_ids = sorted(self._tokenizer.eos_token_ids) + [
                    ids[0] for ids in map(self._tokenizer.encode, _CLOSING_CHARS) if len(ids) == 1]
                self._compiler = xgr.GrammarCompiler(info)
            return self._compiler

    def compile(self, constraint: Constraint) -> Any:
        """The compiled grammar; an invalid spec is a :class:`ConstraintError` naming the kind."""
        compiler = self._get_compiler()
        try:
            if constraint.kind == "json_object":
                return compiler.compile_grammar(_json_grammar('{"type": "object"}'))
            if constraint.kind == "json_schema":
                json.loads(constraint.spec)  # a clear message for text that is not JSON at all
                return compiler.compile_grammar(_json_grammar(constraint.spec))
            if constraint.kind == "regex":
                return compiler.compile_regex(constraint.spec)
            if constraint.kind == "ebnf":
                return compiler.compile_grammar(constraint.spec)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with its parser's message
            raise ConstraintError(f"invalid {constraint.kind}: {_parser_message(exc)}") from None
        raise ConstraintError(f"unknown constraint kind {constraint.kind!r}")

    def start(self, constraint: Constraint) -> TokenGrammar:
        """A fresh per-request grammar state; a :class:`ConstraintError` for a grammar that accepts nothing."""
        import xgrammar as xgr

        grammar = TokenGrammar(xgr.GrammarMatcher(self.compile(constraint)), self, self._vocab_size)
        if not grammar.can_start():
            raise ConstraintError(f"this {constraint.kind} accepts no text at all, so nothing could be generated")
        grammar.closing_length()  # sets the budget check's first estimate
        return grammar


def _parser_message(exc: Exception) -> str:
    """The first line of xgrammar's message, without its log prefix (time, C++ file and line)."""
    text = str(exc).strip()
    return _XGRAMMAR_LOG_HEAD.sub("", text.splitlines()[0]).strip() if text else type(exc).__name__


# xgrammar 0.2.7 writes a length-bounded string's characters (maxLength/minLength) as any character
# but quote, backslash, CR and LF: raw control characters then pass, and JSON parsers refuse them.
# Its byte matcher also reads a byte that is not valid UTF-8 (a surrogate, an overlong form, a lone
# lead byte) as one character U+0080..U+00FF, which Python decodes as one or more U+FFFD: the length
# would be off. Bounded strings therefore take printable ASCII and U+0100 upwards (no surrogates).
# A range that crosses a UTF-8 lead-byte boundary is matched loosely too: U+0100..U+D7FF in one
# range let the overlong E0 80 80 in (three U+FFFD, a maxLength overrun seen in CI), so the ranges
# are split where the lead byte's second-byte limits change (E0, E1..EC, ED, EE..EF, F0..F4).
_LOOSE_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_CHAR = ('[ !#-\\[\\]-\\x7f\\u0100-\\u07FF\\u0800-\\u0FFF\\u1000-\\uCFFF\\uD000-\\uD7FF'
              '\\uE000-\\uFFFF\\U00010000-\\U0010FFFF]')
# Its \uXXXX escape takes any four hex digits, a lone surrogate too ("\udfcb"): valid JSON
# text, but no Unicode string, so clients that re-encode the parsed value (the OpenAI Agents SDK
# fingerprints tool arguments as UTF-8) fail. Escapes therefore stop short of U+D800..U+DFFF.
_ANY_ESCAPE = '("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9])'
_NO_SURROGATE = '("u" (([0-9A-Ca-cEeFf] [A-Fa-f0-9]) | ([Dd] [0-7])) [A-Fa-f0-9] [A-Fa-f0-9])'


def _json_grammar(schema: str) -> str:
    """The EBNF xgrammar derives from ``schema`` (compact JSON), with strings that JSON allows."""
    import xgrammar as xgr

    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    return str(grammar).replace(_LOOSE_CHAR, _JSON_CHAR).replace(_ANY_ESCAPE, _NO_SURROGATE)


class TokenGrammar:
    """One request's position in its grammar; used by the engine loop thread only."""

    def __init__(self, matcher: xgrammar.GrammarMatcher, grammars: Grammars, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._matcher = matcher
        self._grammars = grammars
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._last_closing = 0

    @property
    def terminated(self) -> bool:
        return self._matcher.is_terminated()

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (one row) with every token the grammar forbids next at ``-inf`` (a copy)."""
        return self._masked(self._matcher, logits.float().clone())

    def _masked(self, matcher: Any, row: torch.Tensor) -> torch.Tensor:
        matcher.fill_next_token_bitmask(self._bitmask)
        n = min(row.shape[-1], self._bitmask.shape[-1] * 32)
        view = row[:n].unsqueeze(0)
        self._xgr.apply_token_bitmask_inplace(view, self._bitmask, vocab_size=n)
        row[n:] = float("-inf")
        return row

    def advance(self, token: int, remaining: int) -> int:
        """Accept ``token`` (chosen from the masked logits), or the closing path's next token instead if
        ``token`` leads to a dead end (a state nothing can follow: xgrammar lets some byte prefixes of
        characters in, no token can complete) or would leave too few of the ``remaining`` tokens to
        finish. Returns the token accepted."""
        trial = self._matcher.fork()
        ok = trial.accept_token(token) and (trial.is_terminated() or bool(self._allowed(trial).any()))
        if ok and remaining <= 2 * self._last_closing + _CHECK_MARGIN:
            after = self._closing_path(trial)
            ok = after is not None and len(after) <= remaining - 1
            if after is not None:
                self._last_closing = len(after)
        if not ok:
            path = self._closing_path(self._matcher)
            if path:
                token = path[0]
        if not self._matcher.accept_token(token):
            raise EngineError(f"token {token} does not match the grammar")
        return token

    def can_start(self) -> bool:
        """Whether the grammar allows a first token (or the empty reply)."""
        return self._matcher.is_terminated() or bool(self._allowed(self._matcher).any())

    def _allowed(self, matcher: Any) -> torch.Tensor:
        return self._masked(matcher, torch.zeros(self._bitmask.shape[-1] * 32)) > float("-inf")

    def closing_length(self) -> int | None:
        path = self._closing_path(self._matcher)
        if path is not None:
            self._last_closing = len(path)
        return None if path is None else len(path)

    def _closing_path(self, matcher: Any) -> list[int] | None:
        """Tokens that finish the reply from ``matcher``'s state (stop token included), without
        changing it; ``None`` if none is found within a bound."""
        fork = matcher.fork()
        tokenizer, preferred = self._grammars._tokenizer, self._grammars._closing_ids
        path: list[int] = []
        while not fork.is_terminated():
            if len(path) > _MAX_CLOSING:
                return None
            forced = fork.find_jump_forward_string()
            if forced:
                ids = tokenizer.encode(forced)
                for t in ids:
                    if not fork.accept_token(t):
                        return None
                path += ids
                continue
            allowed = self._allowed(fork)
            choice = next((t for t in preferred if t < allowed.shape[0] and allowed[t]), None)
            if choice is None:
                choice = int(allowed.nonzero()[0]) if allowed.any() else None
            if choice is None or not fork.accept_token(choice):
                return None
            path.append(choice)
        return path
