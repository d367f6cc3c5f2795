"""Constants and the tie rule shared by the solvers."""

from __future__ import annotations

import math

INF = math.inf
EPS = 1e-12  # a hit probability below this is no hit
STEPS_DIGITS = 6
"""Significant digits of every expected-steps value (relative resolution about 1e-6)."""


def round_steps(x: float) -> float:
    """``x`` to :data:`STEPS_DIGITS` significant digits (0 and ``inf`` unchanged): the tie rule."""
    if x == 0 or x == INF:
        return x
    return float(f"{x:.{STEPS_DIGITS}g}")
