"""Sentinel node names shared by the DSL, the Agent Step Graph and the LangGraph adapter.

They equal LangGraph's own ``START``/``END`` strings, so graphs translate without renaming.
"""

from __future__ import annotations

import sys

__all__ = ["START", "END", "RESERVED_NAMES"]

START: str = sys.intern("__start__")
END: str = sys.intern("__end__")
RESERVED_NAMES: frozenset[str] = frozenset({START, END})
