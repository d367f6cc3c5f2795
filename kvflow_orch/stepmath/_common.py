"""Constants and the tie rule shared by the solvers."""

from __future__ import annotations

import math

INF = math.inf
EPS = 1e-12  # a hit probability below this is no hit
STEPS_DIGITS = 6
"""Significant digits of every expected-steps value (relative resolution about 1e-6)."""

_SCALE = {k: 10.0 ** k for k in range(-24, 25)}
_log10, _floor = math.log10, math.floor


def round_steps(x: float) -> float:
    """``x`` to :data:`STEPS_DIGITS` significant digits (0 and ``inf`` unchanged): the tie rule.

    Scaled, rounded to an integer and scaled back: the same float as the decimal rounding
    ``float(f"{x:.6g}")`` in twice less time (it runs once per score)."""
    if x == 0 or x == INF or x != x:
        return x
    scale = _SCALE.get(STEPS_DIGITS - 1 - _floor(_log10(abs(x))))
    if scale is None:
        return float(f"{x:.{STEPS_DIGITS}g}")
    return round(x * scale) / scale


def swap_in_pivot(a: list[list[float]], k: int) -> int:
    """Partial pivoting: move the row (at or below ``k``) with the largest ``|a[i][k]|`` to row ``k``;
    returns where it came from. ZeroDivisionError when the column is all zero (a singular matrix)."""
    p = max(range(k, len(a)), key=lambda i: abs(a[i][k]))
    if abs(a[p][k]) < 1e-300:
        raise ZeroDivisionError("singular matrix")
    if p != k:
        a[k], a[p] = a[p], a[k]
    return p
