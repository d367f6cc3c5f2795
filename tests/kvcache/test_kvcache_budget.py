"""The prefetch budget rule (budget.py), which the brain's planner and the SGLang plugin share."""

from __future__ import annotations

import math

from backends.kvcache.budget import prefetch_room, take_in_order

# (name, tokens, tags) in eviction order: untagged first, then less urgent prefixes
ORDER = [("dyn1", 3, None), ("dyn2", 2, None), ("far", 4, {("ns", "far")}), ("soon", 5, {("ns", "soon")}),
         ("late", 9, None)]
STEPS = {("ns", "far"): 5.0, ("ns", "soon"): 1.0}


def room(need: float, steps: float):
    victims, got = prefetch_room(iter(ORDER), need, steps, size=lambda n: n[1], tags=lambda n: n[2],
                                 steps_of=lambda ref: STEPS.get(ref, math.inf))
    return [n[0] for n in victims], got


def test_room_stops_at_the_first_node_as_urgent_as_the_agent():
    assert room(100, 1.0) == (["dyn1", "dyn2", "far"], 9)  # "soon" (steps 1) is as urgent: the bar
    assert room(100, 5.0) == (["dyn1", "dyn2"], 5)  # "far" (steps 5) bars an agent due in 5 steps
    assert room(100, 0.0) == (["dyn1", "dyn2", "far", "soon", "late"], 23)  # nothing as urgent as 0


def test_room_reads_no_further_than_the_need():
    read = []

    def order():
        for node in ORDER:
            read.append(node[0])
            yield node

    assert take_in_order(order(), 4, lambda n: n[1]) == ([ORDER[0], ORDER[1]], 5)
    assert read == ["dyn1", "dyn2"]  # the walk is bounded by the need, not the tree
    assert take_in_order(order(), 0, lambda n: n[1]) == ([], 0)
