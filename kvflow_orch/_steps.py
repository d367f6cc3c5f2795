"""Steps-to-execution as the least fixed point of superior functions.

The equations are, for every node ``v`` that is neither running nor triggered::

    steps(v) = 1 + min over v's trigger groups g of cost(g)
    cost({u})          = steps(u)
    cost(AND group g)  = max of steps(u) over the members u of g that have not arrived

and ``steps(v) = 0`` for running or triggered nodes. ``min``, ``max`` and ``+1`` are superior
functions, so Knuth's 1977 generalisation of Dijkstra's algorithm finds the least fixed point:
finalise values in nondecreasing order; a single-member group offers ``steps(u) + 1`` to its target
as soon as ``u`` is final, an AND group offers ``(last member finalised) + 1`` once all of its
non-arrived members are final (they are finalised in nondecreasing order, so the last one holds the
max). Because every function adds exactly 1, the priority queue degenerates into a FIFO of levels
(a bucket queue), which makes one solve O(V + E) instead of O(E log V).

An AND group whose members have all arrived never needs a cost: the arrival of its last member
triggers the target (steps 0) and resets the flags, so that state does not exist between updates.
Nodes that are never finalised cannot run again and keep ``math.inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["TriggerIndex", "solve_steps"]

INF = math.inf


@dataclass(frozen=True, slots=True)
class TriggerIndex:
    """Trigger groups of a graph over dense node indices, precomputed once at compile time.

    Invariants: indices run over ``0..size-1`` (START included, END excluded); every AND group has
    at least two distinct members and one *slot* per member; ``member_slots[u]`` lists the slots
    through which ``u`` takes part in AND groups.
    """

    size: int
    single_targets: tuple[tuple[int, ...], ...]  # u -> every v having the group {u}
    member_slots: tuple[tuple[int, ...], ...]  # u -> slots of u in AND groups
    slot_group: tuple[int, ...]  # slot -> AND group
    group_target: tuple[int, ...]  # AND group -> target node
    group_slots: tuple[tuple[int, ...], ...]  # AND group -> its slots

    @classmethod
    def build(
        cls,
        size: int,
        singles: list[tuple[int, int]],
        ands: list[tuple[tuple[int, ...], int]],
    ) -> "TriggerIndex":
        """``singles`` are ``(u, v)`` groups (duplicates allowed); ``ands`` are ``(members, v)``."""
        single_targets: list[dict[int, None]] = [{} for _ in range(size)]
        for u, v in singles:
            single_targets[u][v] = None
        member_slots: list[list[int]] = [[] for _ in range(size)]
        slot_group: list[int] = []
        group_target: list[int] = []
        group_slots: list[tuple[int, ...]] = []
        for group, (members, target) in enumerate(ands):
            slots = []
            for u in members:
                member_slots[u].append(len(slot_group))
                slots.append(len(slot_group))
                slot_group.append(group)
            group_target.append(target)
            group_slots.append(tuple(slots))
        return cls(
            size,
            tuple(tuple(t) for t in single_targets),
            tuple(tuple(s) for s in member_slots),
            tuple(slot_group),
            tuple(group_target),
            tuple(group_slots),
        )


def solve_steps(
    index: TriggerIndex,
    active: "list[int] | tuple[int, ...] | set[int] | dict[int, object]",
    arrived: list[bool],
    pending: list[int],
) -> list[float]:
    """Least fixed point of the steps equations; one value per node index.

    ``active``: indices of running or triggered nodes (value 0). ``arrived[slot]``: the AND-member
    flag. ``pending[group]``: how many members of the group have not arrived (not modified).
    """
    dist: list[float] = [INF] * index.size
    frontier = []
    for u in active:
        if dist[u] is INF:
            dist[u] = 0
            frontier.append(u)
    remaining = pending.copy()
    single_targets = index.single_targets
    member_slots = index.member_slots
    slot_group = index.slot_group
    group_target = index.group_target
    level = 0
    while frontier:
        level += 1
        following = []
        for u in frontier:
            # `is INF` is exact: unset entries are the very `math.inf` object the list was filled with.
            for v in single_targets[u]:
                if dist[v] is INF:
                    dist[v] = level
                    following.append(v)
            for slot in member_slots[u]:
                if arrived[slot]:
                    continue
                group = slot_group[slot]
                remaining[group] -= 1
                if remaining[group] == 0:
                    v = group_target[group]
                    if dist[v] is INF:
                        dist[v] = level
                        following.append(v)
        frontier = following
    return dist
