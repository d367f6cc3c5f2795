"""CacheConfig.from_options: the one reader of cache options for the engine and both plugins."""

from __future__ import annotations

import pytest

from backends.kvcache import CacheConfig


def test_options_set_fields_over_a_base_and_the_pool_size_over_both():
    base = CacheConfig(device_tokens=8, host_tokens=32, max_inflight_loads=2)
    config = CacheConfig.from_options({"prefetch": False, "hint_ttl_s": 30, "device_tokens": 99}, base=base,
                                      device_tokens=1000)
    assert config == CacheConfig(device_tokens=1000, host_tokens=32, max_inflight_loads=2, prefetch=False,
                                 hint_ttl_s=30)
    assert CacheConfig.from_options({"namespace_cap_tokens": None}, device_tokens=4).namespace_cap_tokens is None


def test_the_callers_own_options_are_accepted_and_left_to_it():
    config = CacheConfig.from_options({"prefetch": True, "reserved_load_slots": 1}, device_tokens=4,
                                      accepted=("prefetch", "reserved_load_slots"))
    assert config == CacheConfig(device_tokens=4)


@pytest.mark.parametrize("options, message", [
    ({"lookahed": 2}, r"unknown kvflow option\(s\) lookahed in ENV; known: hint_ttl_s, max_tracked_tokens, prefetch, "),
    ({"prefetch_lookahead": "2"}, r"kvflow option prefetch_lookahead must be an integer, got '2' in ENV"),
    ({"prefetch": 1}, "prefetch must be true or false, got 1"),
    ({"max_tracked_tokens": True}, "max_tracked_tokens must be an integer or null, got True"),
    ({"hint_ttl_s": None}, "hint_ttl_s must be a number, got None"),
    ({"prefetch_lookahead": -1}, "prefetch_lookahead must be >= 0"),  # the field's own check
])
def test_unknown_names_and_bad_values_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        CacheConfig.from_options(options, device_tokens=4, accepted=("prefetch", "prefetch_lookahead", "hint_ttl_s",
                                                                     "max_tracked_tokens"), source=" in ENV")
