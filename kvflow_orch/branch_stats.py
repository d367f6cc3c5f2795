"""Learned routing frequencies: how often each router of a workflow chose each of its targets.

    stats = BranchStats()
    stats.observe("supervisor", "supervisor", ["coder"])        # one routing decision
    stats.probabilities("supervisor", "supervisor", ["coder", "writer", END])
    stats.save("stats.json"); BranchStats.load("stats.json")

Keys are (workflow name, router node); START is a router when it has conditional edges. A decision
may pick several targets (fan-out) or none; the probability of a target is the smoothed share of
decisions that included it::

    p(t) = (count(t) + alpha) / (decisions + alpha * K)

where K is the number of targets asked about (the router's declared targets when the caller passes
them), so a router never observed is uniform and no declared target gets probability 0. With
``decay < 1`` every observation first multiplies the router's counts by ``decay``, so old decisions
fade (a window of about ``1 / (1 - decay)`` decisions) and a drifting app is followed.

Expected steps read the counts through the thin-statistics guard (:func:`kvflow_orch.stepmath.pooled`):
targets whose counts do not differ significantly share one probability, so a router with a
handful of decisions keeps the static order among its targets.

Bounded: at most ``max_routers`` routers (the least recently observed is forgotten) and
``max_targets`` targets per router (the rarest other target makes room for a new one). Thread- and task-safe: one lock
guards every read and write; ``version`` changes on every observation so callers can cache what
they derive from the probabilities.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Mapping

__all__ = ["BranchStats", "FORMAT_VERSION"]

FORMAT_VERSION = 1


class _Router:
    __slots__ = ("decisions", "counts")

    def __init__(self) -> None:
        self.decisions = 0.0
        self.counts: dict[str, float] = {}


class BranchStats:
    """Routing frequencies per (workflow, router) -> target; see the module docstring."""

    def __init__(self, *, alpha: float = 1.0, decay: float = 1.0, max_routers: int = 1024,
                 max_targets: int = 256) -> None:
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
        if not (isinstance(decay, (int, float)) and 0 < decay <= 1):
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        for what, value in (("max_routers", max_routers), ("max_targets", max_targets)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{what} must be a positive integer, got {value!r}")
        self.alpha = float(alpha)
        self.decay = float(decay)
        self.max_routers = max_routers
        self.max_targets = max_targets
        self._routers: OrderedDict[tuple[str, str], _Router] = OrderedDict()
        self._lock = threading.Lock()
        self._version = 0

    # ------------------------------------------------------------------ writing
    def observe(self, workflow: str, router: str, targets: "str | Iterable[str] | None") -> None:
        """Record one decision of ``router`` in ``workflow``: the targets it chose (a name, a list
        of names, or None/[] for none)."""
        _check_key(workflow, router)
        chosen = [targets] if isinstance(targets, str) else list(targets or ())
        for t in chosen:
            if not isinstance(t, str) or not t:
                raise ValueError(f"BranchStats.observe: targets must be non-empty strings, got {t!r}")
        with self._lock:
            key = (workflow, router)
            entry = self._routers.get(key)
            if entry is None:
                entry = self._routers[key] = _Router()
                while len(self._routers) > self.max_routers:
                    self._routers.popitem(last=False)
            else:
                self._routers.move_to_end(key)
            if self.decay < 1:
                entry.decisions *= self.decay
                for t in entry.counts:
                    entry.counts[t] *= self.decay
            entry.decisions += 1
            chosen = list(dict.fromkeys(chosen))
            for t in chosen:
                entry.counts[t] = entry.counts.get(t, 0.0) + 1
            while len(entry.counts) > self.max_targets:  # the rarest other target makes room
                others = [t for t in entry.counts if t not in chosen] or list(entry.counts)
                del entry.counts[min(others, key=entry.counts.__getitem__)]
            self._version += 1

    # ------------------------------------------------------------------ reading
    def probabilities(self, workflow: str, router: str, targets: Iterable[str] | None = None) -> dict[str, float]:
        """Smoothed probability that a decision of ``router`` includes each target. ``targets``:
        the targets to answer for (default: those observed); uniform before any observation."""
        _check_key(workflow, router)
        with self._lock:
            entry = self._routers.get((workflow, router))
            counts = dict(entry.counts) if entry else {}
            decisions = entry.decisions if entry else 0.0
        names = list(dict.fromkeys(targets)) if targets is not None else sorted(counts)
        if not names:
            return {}
        denom = decisions + self.alpha * len(names)
        return {t: (counts.get(t, 0.0) + self.alpha) / denom for t in names}

    def decisions(self, workflow: str, router: str) -> float:
        """How many decisions of ``router`` were observed (decayed)."""
        with self._lock:
            entry = self._routers.get((workflow, router))
            return entry.decisions if entry else 0.0

    def counts(self, workflow: str, router: str) -> dict[str, float]:
        """How many decisions of ``router`` included each target (decayed; unobserved targets absent)."""
        with self._lock:
            entry = self._routers.get((workflow, router))
            return dict(entry.counts) if entry else {}

    def routers(self, workflow: str | None = None) -> list[tuple[str, str]]:
        """Observed (workflow, router) keys, optionally of one workflow."""
        with self._lock:
            return [k for k in self._routers if workflow is None or k[0] == workflow]

    @property
    def version(self) -> int:
        """Changes on every observation (and load)."""
        return self._version

    def __len__(self) -> int:
        return len(self._routers)

    def copy(self) -> "BranchStats":
        """An independent copy (same settings and counts)."""
        return BranchStats.from_json(self.to_json())

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict:
        with self._lock:
            routers = [
                {"workflow": w, "router": r, "decisions": e.decisions, "counts": dict(e.counts)}
                for (w, r), e in self._routers.items()
            ]
        return {"version": FORMAT_VERSION, "alpha": self.alpha, "decay": self.decay,
                "max_routers": self.max_routers, "max_targets": self.max_targets, "routers": routers}

    @classmethod
    def from_json(cls, data: Mapping) -> "BranchStats":
        """Rebuild from :meth:`to_json`; a ValueError names what is malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"branch stats: expected a JSON object, got {type(data).__name__}")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"branch stats: unsupported format version {data.get('version')!r} "
                             f"(this build reads version {FORMAT_VERSION})")
        stats = cls(alpha=data.get("alpha", 1.0), decay=data.get("decay", 1.0),
                    max_routers=data.get("max_routers", 1024), max_targets=data.get("max_targets", 256))
        routers = data.get("routers", [])
        if not isinstance(routers, list):
            raise ValueError("branch stats: 'routers' must be a list")
        for i, item in enumerate(routers[-stats.max_routers:]):
            try:
                workflow, router = item["workflow"], item["router"]
                _check_key(workflow, router)
                decisions = float(item["decisions"])
                counts = {str(t): float(c) for t, c in dict(item["counts"]).items()}
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"branch stats: routers[{i}] is malformed: {exc}") from None
            if (not math.isfinite(decisions) or decisions < 0
                    or any(not math.isfinite(c) or c < 0 for c in counts.values())):
                raise ValueError(f"branch stats: routers[{i}] has a negative or non-finite count")
            entry = _Router()
            entry.decisions = decisions
            entry.counts = dict(sorted(counts.items(), key=lambda kv: -kv[1])[: stats.max_targets])
            stats._routers[(workflow, router)] = entry
        stats._version = 1
        return stats

    def save(self, path: "str | os.PathLike[str]") -> None:
        """Write the JSON file atomically (a temporary file renamed over ``path``)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: "str | os.PathLike[str]") -> "BranchStats":
        """Read a file written by :meth:`save`."""
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"branch stats file {str(path)!r} is not JSON: {exc}") from None
        return cls.from_json(data)

    def __repr__(self) -> str:
        return f"BranchStats({len(self)} routers, alpha={self.alpha}, decay={self.decay})"


def _check_key(workflow: object, router: object) -> None:
    for what, value in (("workflow", workflow), ("router", router)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"BranchStats: {what} must be a non-empty string, got {value!r}")
