"""Frozen configuration of the cache brain, built once at the edge (engine, simulator, CLI)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Collection, Mapping

__all__ = ["CacheConfig", "DEFAULT_HINT_TTL_S", "namespace_cap"]

DEFAULT_HINT_TTL_S = 600.0


def namespace_cap(namespace_cap_tokens: int | None, device_tokens: int) -> int:
    """Most fixed-prefix tokens one namespace may protect: the configured cap, else half the
    device pool (the one rule for the brain and the SGLang plugin)."""
    if namespace_cap_tokens is None:
        return device_tokens // 2
    return namespace_cap_tokens


@dataclass(frozen=True)
class CacheConfig:
    """Sizes are in tokens (one slot holds the KV of one token in every layer).

    * ``host_tokens == 0`` means no host tier: an evicted device node is dropped.
    * ``write_through``: every inserted node gets host slots at insert (reported as an
      :class:`~backends.kvcache.results.OffloadTask`), so a later demotion costs no copy.
    * ``namespace_cap_tokens``: most fixed-prefix tokens one namespace may protect with finite
      steps; ``None`` means half the device pool.
    * ``prefetch_lookahead``: agents whose steps are <= this are prefetch candidates.
    * ``max_inflight_loads``: at most this many prefetch load tasks in flight at once.
    * ``segment_history``: how many recent requests per agent the segmentation heuristic compares.
    * ``max_tracked_agents`` / ``max_workflows``: memory bounds of the hint and segmentation tables;
      the least recently used entry is forgotten beyond them.
    * ``max_tracked_tokens``: bound on the prompt tokens the segmentation history and the fixed-prefix
      table keep (each; the most recent agent's entry is kept even when it alone is larger);
      ``None`` means max(4 x device_tokens, 2**20).
    * ``continuations``: keep a conversation across its agent's pause (a reply ending in tool calls,
      a hint's ``resume_in_s``) until a retention deadline (:mod:`.continuations`);
      ``tool_default_s`` is the pause expected of a tool never observed yet (its rank),
      ``tool_cold_hold_s`` how long such a pause is kept (a slow tool's first run outlasts the
      expected 2 s; the rank sinks as it runs over), ``step_default_s`` the
      duration of one model call before any was observed (the unit that turns seconds into steps),
      ``continuation_max_s`` the longest a conversation is kept (``hint_ttl_s`` if shorter: a kept
      conversation rides on the hint table).
    """

    device_tokens: int
    host_tokens: int = 0
    policy: str = "kvflow"
    write_through: bool = False
    hint_ttl_s: float = DEFAULT_HINT_TTL_S
    namespace_cap_tokens: int | None = None
    prefetch: bool = True
    prefetch_lookahead: int = 1
    max_inflight_loads: int = 4
    segment_history: int = 2
    max_tracked_agents: int = 65536
    max_workflows: int = 16384
    max_tracked_tokens: int | None = None
    continuations: bool = True
    tool_default_s: float = 2.0
    tool_cold_hold_s: float = 30.0
    step_default_s: float = 1.0
    continuation_max_s: float = 120.0

    def __post_init__(self) -> None:
        if self.device_tokens <= 0:
            raise ValueError(f"device_tokens must be > 0, got {self.device_tokens}")
        if self.host_tokens < 0:
            raise ValueError(f"host_tokens must be >= 0, got {self.host_tokens}")
        if self.hint_ttl_s <= 0:
            raise ValueError(f"hint_ttl_s must be > 0, got {self.hint_ttl_s}")
        if self.namespace_cap_tokens is not None and self.namespace_cap_tokens < 0:
            raise ValueError(f"namespace_cap_tokens must be >= 0, got {self.namespace_cap_tokens}")
        if self.prefetch_lookahead < 0:
            raise ValueError(f"prefetch_lookahead must be >= 0, got {self.prefetch_lookahead}")
        if self.max_inflight_loads < 0:
            raise ValueError(f"max_inflight_loads must be >= 0, got {self.max_inflight_loads}")
        if self.segment_history < 2:
            raise ValueError(f"segment_history must be >= 2, got {self.segment_history}")
        if self.max_tracked_agents <= 0 or self.max_workflows <= 0:
            raise ValueError("max_tracked_agents and max_workflows must be > 0")
        if self.max_tracked_tokens is not None and self.max_tracked_tokens <= 0:
            raise ValueError(f"max_tracked_tokens must be > 0, got {self.max_tracked_tokens}")
        for name in ("tool_default_s", "tool_cold_hold_s", "step_default_s", "continuation_max_s"):
            value = getattr(self, name)
            if not (value > 0 and value != float("inf")):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value}")

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """Every field name, i.e. every option :meth:`from_options` sets."""
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def from_options(
        cls,
        options: Mapping[str, Any],
        *,
        base: CacheConfig | None = None,
        device_tokens: int | None = None,
        accepted: Collection[str] | None = None,
        label: str = "kvflow option",
        source: str = "",
    ) -> CacheConfig:
        """The one reader of cache options a host receives (flags, policy JSON, an environment
        variable): ``base`` (default pool sizes and knobs of the host) with the options that name
        fields of this class set on it, and ``device_tokens`` (a pool size only the host knows)
        over both.

        ``accepted`` lists every option name the caller takes (``None``: any name); names in it
        that are no field of this class are the caller's own and are left to it. Raises
        ValueError naming an unknown option (``unknown {label}(s) ...{source}; known: ...``), a
        value of the wrong type, or a value the fields' checks refuse.
        """
        unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
        if unknown:
            raise ValueError(f"unknown {label}(s) {', '.join(unknown)}{source}; known: {', '.join(sorted(accepted))}")
        types = {f.name: str(f.type) for f in fields(cls)}
        mine = {name: value for name, value in options.items() if name in types}
        for name, value in mine.items():
            if not _fits(types[name], value):
                raise ValueError(f"{label} {name} must be {_describe(types[name])}, got {value!r}{source}")
        if device_tokens is not None:
            mine["device_tokens"] = device_tokens
        if base is None:
            return cls(**mine)
        return replace(base, **mine)

    @property
    def has_host_tier(self) -> bool:
        return self.host_tokens > 0

    @property
    def tracked_tokens(self) -> int:
        if self.max_tracked_tokens is None:
            return max(4 * self.device_tokens, 1 << 20)
        return self.max_tracked_tokens

    @property
    def effective_namespace_cap(self) -> int:
        """Protected-token cap per namespace (see :func:`namespace_cap`)."""
        return namespace_cap(self.namespace_cap_tokens, self.device_tokens)


def _fits(annotation: str, value: Any) -> bool:
    """Whether ``value`` suits a field annotated ``annotation`` (bool is no number here)."""
    if value is None:
        return annotation.endswith("| None")
    kind = annotation.removesuffix(" | None")
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, (int, float))
    return isinstance(value, str)


def _describe(annotation: str) -> str:
    kind = annotation.removesuffix(" | None")
    words = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}[kind]
    return words + (" or null" if annotation.endswith("| None") else "")
