"""Limits every kvflow message obeys, and the one validator of ids and step maps.

Steps have one representation in Python: a mapping agent -> float, ``math.inf`` meaning "not
expected to run again". On the wire (JSON) ``inf`` is ``null`` and every other value a plain
number; integral values are JSON integers, so ``{"coder": 0.0, "qa": 1.0, "pm": inf}`` travels as
``{"coder": 0, "qa": 1, "pm": null}``. :func:`check_steps` reads either form and returns the Python
one; :func:`steps_as_json` writes the wire one.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Mapping

from .errors import HintError

__all__ = ["MAX_NAME_LEN", "MAX_AGENTS", "DEFAULT_NAMESPACE", "MAX_CACHE_SALT_LEN", "MAX_RESUME_IN_S", "check_name",
           "check_steps", "check_resume_in_s", "check_cache_salt", "steps_as_json"]

MAX_NAME_LEN = 256
MAX_AGENTS = 4096
DEFAULT_NAMESPACE = "default"
MAX_CACHE_SALT_LEN = 128
"""``cache_salt`` (a request's top-level field, vLLM's name): vLLM 0.32's bound, and its characters."""
_SALT_FORBIDDEN = frozenset("@/\\\0")
MAX_RESUME_IN_S = 86400.0
"""A hint's ``resume_in_s`` (seconds until a pausing agent calls again) is at most a day: a longer
pause is no reason to hold KV, and the bound keeps one client from pinning memory indefinitely."""


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a valid id (non-empty string, at most MAX_NAME_LEN characters); else
    :class:`HintError` naming ``what``."""
    if not isinstance(value, str) or not value:
        raise HintError(f"{what} must be a non-empty string")
    if len(value) > MAX_NAME_LEN:
        raise HintError(f"{what} is {len(value)} characters long; the limit is {MAX_NAME_LEN}")
    return value


def check_cache_salt(value: Any) -> str | None:
    """``value`` if it is a valid ``cache_salt``: ``None``, or a non-empty string of at most
    MAX_CACHE_SALT_LEN characters without ``@``, ``/``, ``\\`` or NUL (the rule vLLM applies, so a
    salt one backend takes every backend takes). Requests with different salts never share cached
    KV; ValueError otherwise, naming the field."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError("cache_salt must be a non-empty string")
    if len(value) > MAX_CACHE_SALT_LEN or not _SALT_FORBIDDEN.isdisjoint(value):
        raise ValueError(f"cache_salt must be at most {MAX_CACHE_SALT_LEN} characters, without '@', '/', '\\\\' or NUL")
    return value


def check_steps(steps: Any) -> dict[str, float]:
    """A step map in its Python form: agent -> float, ``None`` read as ``math.inf``.

    Values are non-negative numbers (integral or not, ``inf`` included) or ``None``; bool, NaN,
    negative and non-numeric values, empty or over-long names and more than MAX_AGENTS agents
    raise :class:`HintError` naming the entry at fault as a field path (``steps.<agent>``), as
    pydantic names fields. Key order is kept.
    """
    if not isinstance(steps, Mapping):
        raise HintError(f"steps must be an object mapping agent names to numbers, got {type(steps).__name__}")
    if len(steps) > MAX_AGENTS:
        raise HintError(f"steps names {len(steps)} agents; the limit is {MAX_AGENTS}")
    out: dict[str, float] = {}
    for agent, value in steps.items():
        check_name(agent, "agent name in steps")
        if value is None:
            out[agent] = math.inf
            continue
        out[agent] = _step(agent, value)
    return out


def check_resume_in_s(value: Any) -> float | None:
    """A hint's ``resume_in_s`` as a float: ``None`` (no pause announced), or a finite number of
    seconds in ``[0, MAX_RESUME_IN_S]``; bool, NaN, infinities, negative, too large and non-numeric
    values raise :class:`HintError` naming the field, as a bad step does."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HintError(f"resume_in_s is {_shown(value)}; expected a number of seconds >= 0 or null")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if math.isnan(number) or not 0 <= number <= MAX_RESUME_IN_S:
        raise HintError(f"resume_in_s is {_shown(value)}; expected a finite number of seconds in "
                        f"[0, {MAX_RESUME_IN_S:g}] or null")
    return number


def _step(agent: str, value: Any) -> float:
    # bool is an int subclass, but True steps is a caller's mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HintError(f"steps.{agent} is {_shown(value)}; expected a number >= 0 or null")
    if value < 0:
        raise HintError(f"steps.{agent} is {_shown(value)}; steps-to-execution must be >= 0 or null")
    try:
        number = float(value)
    except OverflowError:  # a JSON integer past float's range (1 followed by 400 zeros)
        raise HintError(f"steps.{agent} is {_shown(value)}, past the largest number a step may be "
                        f"({sys.float_info.max:.3g}); send null for 'not expected again'") from None
    if math.isnan(number):
        raise HintError(f"steps.{agent} is NaN; expected a number >= 0 or null")
    return number


def _shown(value: Any) -> str:
    """``value`` for an error message, cut short: a message never echoes a megabyte back (and
    Python refuses to print integers of more than 4,300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def steps_as_json(steps: Mapping[str, float]) -> dict[str, int | float | None]:
    """The wire form of a (validated) step map: ``None`` for ``inf``, ints for integral values.

    Plain data, so it also suits msgpack/pickle messages that must not carry pydantic models.
    """
    return {
        agent: None if math.isinf(value) else int(value) if float(value).is_integer() else value
        for agent, value in steps.items()
    }
