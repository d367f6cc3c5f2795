"""The workflow state and its merge rules.

Every node execution reads a snapshot of the state taken when it starts and returns an update
(a dict). Updates are merged when the execution finishes, key by key:

* a key with a reducer (``Annotated[list, operator.add]`` in the state schema, or
  ``Workflow(reducers=...)``) is combined: ``new = reducer(old, value)``; a missing key takes the
  value as is;
* any other key is last-write-wins — unless the write is **concurrent**: the key's previous writer
  finished after this execution started, so this execution never saw that value and one of the two
  writes would be silently lost. That is a :class:`WorkflowError` naming both nodes.

Times are logical (an event counter the runtime advances at every start and finish), so the rule
does not depend on clock resolution.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .errors import WorkflowError

__all__ = ["StateStore"]


class StateStore:
    def __init__(self, inputs: Mapping[str, Any], reducers: Mapping[str, Callable[[Any, Any], Any]]) -> None:
        if not isinstance(inputs, Mapping):
            raise WorkflowError(f"workflow inputs must be a dict, got {type(inputs).__name__}")
        self.values: dict[str, Any] = dict(inputs)
        self._reducers = reducers
        # key -> (writer node, logical time its execution finished); inputs are written at time 0
        self._last_write: dict[str, tuple[str, int]] = {k: ("<inputs>", 0) for k in inputs}

    def snapshot(self) -> dict[str, Any]:
        return dict(self.values)

    def merge(self, node: str, update: Any, started: int, finished: int) -> None:
        """Apply ``update`` from an execution of ``node`` that ran from ``started`` to ``finished``."""
        if update is None:
            return
        if not isinstance(update, Mapping):
            raise WorkflowError(f"node {node!r} returned {type(update).__name__}; "
                                "a node returns a dict of state updates or None")
        for key, value in update.items():
            reducer = self._reducers.get(key)
            if reducer is not None:
                if key in self.values:
                    try:
                        value = reducer(self.values[key], value)
                    except Exception as exc:
                        raise WorkflowError(
                            f"reducer of key {key!r} failed on the update from node {node!r}: {exc}") from exc
            else:
                previous = self._last_write.get(key)
                if previous is not None and previous[1] > started:
                    raise WorkflowError(
                        f"nodes {previous[0]!r} and {node!r} both wrote state key {key!r} while running "
                        f"concurrently; declare a reducer for {key!r} (e.g. Annotated[list, operator.add]) "
                        f"or write different keys"
                    )
            self.values[key] = value
            self._last_write[key] = (node, finished)
