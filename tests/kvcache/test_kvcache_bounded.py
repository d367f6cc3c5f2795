"""BoundedLRU: the one bounded table behind every per-agent and per-workflow map."""

from __future__ import annotations

import pytest

from backends.kvcache.bounded import BoundedLRU


def test_bound_on_entries_forgets_the_least_recently_stored_first():
    table: BoundedLRU[str, int] = BoundedLRU(3)
    for i, key in enumerate("abcd"):
        gone = table.put(key, i)
    assert gone == [("a", 0)] and list(table) == ["b", "c", "d"]
    assert table.put("b", 9) == []  # a refresh makes b the newest; nothing forgotten
    assert table.put("e", 4) == [("c", 2)] and list(table) == ["d", "b", "e"]
    assert table.get("b") == 9 and list(table) == ["d", "b", "e"]  # reading changes no order


def test_bound_on_weight_keeps_the_newest_entry_even_alone_over_it():
    table: BoundedLRU[str, tuple[int, ...]] = BoundedLRU(100, max_weight=10, weigh=len)
    table.put("a", (1,) * 4)
    table.put("b", (2,) * 4)
    assert table.put("c", (3,) * 4) == [("a", (1,) * 4)] and table.weight == 8
    assert table.put("big", (7,) * 20) == [("b", (2,) * 4), ("c", (3,) * 4)]
    assert list(table) == ["big"] and table.weight == 20


def test_a_value_changed_in_place_is_weighed_again_when_stored_again():
    table: BoundedLRU[str, list[int]] = BoundedLRU(10, max_weight=5, weigh=len)
    value = [1, 2]
    table.put("a", value)
    table.put("b", [3])
    value.extend([4, 5, 6])
    assert table.put("a", value) == [("b", [3])] and table.weight == 5


def test_pop_oldest_and_bounds_changed_later():
    table: BoundedLRU[str, int] = BoundedLRU(5)
    for i, key in enumerate("abc"):
        table.put(key, i)
    assert table.oldest() == ("a", 0) and table.pop_oldest() == ("a", 0) and table.pop("zz") is None
    table.max_entries = 1
    assert table.put("d", 3) == [("b", 1), ("c", 2)] and len(table) == 1 and "d" in table
    with pytest.raises(KeyError):
        BoundedLRU(1).pop_oldest()
    with pytest.raises(ValueError, match="max_entries"):
        BoundedLRU(0)
