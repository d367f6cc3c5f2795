"""The book of transfers in flight: which nodes each load or offload task covers.

A node is LOADING (or OFFLOADING) from its task's creation until the engine reports the copy done
or failed; the book keeps the node list of every open task so that completing it, failing it or
checking integrity finds them, including nodes a split added after the task was planned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Iterator, TypeVar

from .errors import UnknownTaskError

if TYPE_CHECKING:
    from .radix import Node

__all__ = ["TaskBook"]

T = TypeVar("T")


class TaskBook(Generic[T]):
    """Open tasks of one kind (``"load"`` or ``"offload"``), by task id."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._open: dict[int, tuple[T, list[Node]]] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._open

    def open(self, task_id: int, task: T, nodes: list[Node]) -> None:
        self._open[task_id] = (task, nodes)

    def nodes(self, task_id: int) -> list[Node]:
        """The nodes of an open task; raises :class:`UnknownTaskError` when it is not open."""
        entry = self._open.get(task_id)
        if entry is None:
            raise UnknownTaskError(f"{self.kind} task {task_id} is not in flight (completed or failed already?)")
        return entry[1]

    def close(self, task_id: int) -> list[Node]:
        """Forget an open task; returns its nodes (raises :class:`UnknownTaskError` when not open)."""
        nodes = self.nodes(task_id)
        del self._open[task_id]
        return nodes

    def tasks(self) -> Iterator[T]:
        return (task for task, _ in self._open.values())

    def entries(self) -> Iterator[tuple[int, list[Node]]]:
        return ((task_id, nodes) for task_id, (_, nodes) in self._open.items())

    def note_split(self, upper: Node, lower: Node, task_id: int | None) -> None:
        """``lower`` was split and ``upper`` took its head: the task covering it covers both."""
        if task_id is not None and task_id in self._open:
            self._open[task_id][1].append(upper)
