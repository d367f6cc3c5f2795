"""Expected steps-to-execution under branch probabilities: the one copy of the math.

A leaf of the standard library only, so every learner ranks agents by the same numbers: the
tracker's learned routing (:mod:`kvflow_orch._expected`, used by the DSL runtime, the LangGraph
adapter and the simulator) and a learner of plain traffic inside a server (``backends/``), which
may import this module and the wire contract but nothing else of the orchestrator.

**States and outcomes.** States are ``0..n-1`` (workflow nodes, or the agents of a learned chain).
When state ``u`` fires, each of its *outcomes* is a mapping successor -> probability whose sum is at
most 1 (the rest ends the run): a plain edge is ``{w: 1.0}``, a router ``{w: p(w), ...}``. A state
with several outcomes (a fan-out: several plain edges, a plain edge and a router) counts, for each
target, its most urgent outcome, as the static solver takes the ``min``.

**Expected steps.** For target ``v`` let ``T_v`` be the steps from ``u``'s firing until ``v`` next
starts (its successors start at step 1), ``h_v(u) = P(T_v < inf)`` and ``g_v(u) = E[T_v ; T_v <
inf]``. The score ``g_v(u) / h_v(u)**2 = E[T_v | v runs] / P(v runs)`` is the expected steps until
``v`` runs if the run were retried until it does; ``inf`` when ``v`` cannot run. Of several
outcomes the one with the smallest score counts. With active (running or triggered) states ``A``,
``steps(v) = 0`` for ``v`` in ``A`` and otherwise the smallest score over ``a`` in ``A``; a caller
with static steps ``s`` takes ``max(s(v), ...)`` (AND-join waits; deterministic parts stay static).

* A **chain** (every state has at most one outcome, and every state can end) has a closed form in
  the fundamental matrix ``N = (I - P)^-1`` and ``D = N @ N - N`` (``N_uv``: expected visits of ``v``
  from ``u``; ``D`` comes from the derivative of the generating function)::

      hit = N_av - [a == v]            h_v(a) = hit / N_vv
      score_v(a) = (D_av * N_vv - hit * D_vv) / hit**2

  One O(n^3) inversion serves every target. Changing one state's row is a rank-one change of
  ``I - P`` (Sherman-Morrison): :meth:`ChainSteps.with_rows` updates ``N`` and ``N @ N`` in O(n^2).
* **Several outcomes** (or a chain that cannot end): per target, policy iteration over the choice
  of outcome, each policy solved exactly (``(I - A) h = c``, ``(I - A) g = h`` with ``A`` the policy's
  transitions off ``v`` and ``c`` its transitions into ``v``), O(n^3) per target.

**Ties.** Scores are rounded to :data:`STEPS_DIGITS` significant digits (:func:`round_steps`), so
values equal in exact arithmetic are equal floats whichever solver, path or summation order produced
them (float noise is some 1e-12 relative; the brain breaks equal steps by LRU). Static steps are
integers, which rounding keeps.

**Thin statistics.** :func:`pooled` is the guard every learner applies to a router's (or an
agent's) observed counts: targets whose counts do not differ significantly share one probability,
so a handful of decisions never ranks them apart (they tie, and the brain keeps LRU among them, as
with static steps).
"""

from __future__ import annotations

from ._chain import ChainSteps
from ._common import STEPS_DIGITS, round_steps
from ._outcomes import OutcomeSteps
from ._solve import SIGNIFICANCE_Z, expected_steps, pooled, router_outcomes, solve, solve_ops
from ._transitions import TransitionSteps

__all__ = ["STEPS_DIGITS", "SIGNIFICANCE_Z", "round_steps", "pooled", "router_outcomes", "solve", "solve_ops",
           "expected_steps", "ChainSteps", "OutcomeSteps", "TransitionSteps"]
