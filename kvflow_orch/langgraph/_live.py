"""One LangGraph workflow instance seen through its node tasks, mirrored onto a StepTracker.

LangGraph runs *tasks*: a node normally runs as one task per superstep, ``Send`` makes k tasks of
one node in a step, a retry or a resumed interrupt re-runs the same task. The tracker counts
*executions* that were triggered. This class maps one onto the other:

* a task already known by its key (``langgraph_checkpoint_ns``) starting again is a retry or a
  resume: the tracker already counts it as running;
* the first task of a node sent k times starts it with ``tasks=k``; its k-1 siblings consume that
  reservation; every task finishes on its own;
* every other task start is ``tracker.start(node)``.

The LangGraph graph may do things its declared graph does not say (a ``Command`` to an undeclared
node, a resumed thread whose tracker was lost): the tracker then refuses the transition and
``LiveWorkflow`` records one warning per problem and keeps going with the last consistent steps.
Not thread-safe: the callback handler serialises calls.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Iterable

from ..constants import START
from ..errors import WorkflowError
from ..hinting import WorkflowHints
from ..protocol import DEFAULT_NAMESPACE, KVFlowHint
from ._delivery import Snapshot

__all__ = ["LiveWorkflow", "TrackingWarning"]


_MAX_INNER = 64  # subgraph agents per workflow; more fall back to their outer node's identity


class TrackingWarning(RuntimeWarning):
    """The LangGraph run did something its declared graph does not allow; steps may be stale."""


class LiveWorkflow:
    def __init__(
        self, asg, workflow_id: str, namespace: str = DEFAULT_NAMESPACE, warned: set[str] | None = None,
        branch_stats=None,
    ) -> None:
        self.asg = asg
        self.workflow_id = workflow_id
        self.tracker = asg.tracker(branch_stats)
        self.hints = WorkflowHints(workflow_id, namespace)
        self._live: dict[str, str] = {}  # task key -> node
        self._reserved: Counter[str] = Counter()
        self._sends: Counter[str] = Counter()
        self._warned = set() if warned is None else warned  # shared by the graph's workflows
        self.announced = False
        self._inner: dict[str, str] = {}  # subgraph agent (path) -> the agent of its outer node
        """Whether a hinted request told the server about this workflow."""

    # ----------------------------------------------------------------- transitions
    def task_started(self, node: str, key: str, *, pushed: bool) -> None:
        """A node task began (``pushed``: created by ``Send``)."""
        if node == START or key in self._live:
            self._live.setdefault(key, node)
            return
        self._live[key] = node
        if self._reserved[node] > 0:
            self._reserved[node] -= 1
            return
        tasks = max(1, self._sends.pop(node, 0)) if pushed else 1
        if self._apply(f"start:{node}", self.tracker.start, node, tasks):
            self._reserved[node] = tasks - 1

    def task_finished(self, node: str, key: str, goto: Iterable[str], sends: Iterable[str]) -> None:
        """A node task ended; ``goto`` are the targets its routers chose, ``sends`` its Send targets."""
        if key not in self._live and node != START:
            return
        self._live.pop(key, None)
        self._sends.update(sends)
        allowed = {t for b in self.asg.branches_of(node) for t in b.targets}
        plain = set(self.asg.plain_targets(node))  # fire by themselves: naming them is harmless
        chosen = list(dict.fromkeys(goto))
        for target in chosen:
            if target not in allowed and target not in plain:
                self._warn(
                    f"goto:{node}:{target}",
                    f"node {node!r} routed to {target!r}, which its LangGraph graph does not declare; "
                    f"declare it (path_map, Literal or Command[Literal]) for exact steps",
                )
        self._apply(f"finish:{node}", self.tracker.finish, node, [t for t in chosen if t in allowed])

    def recover(self, node: str, goto: Iterable[str], sends: Iterable[str]) -> None:
        """An error handler completed a failed task of ``node``: that task finishes now.

        The tracker cannot express "ended without writing", so the node's plain edges fire too;
        the steps are exact again once the run moves past it.
        """
        key = next((k for k, n in self._live.items() if n == node), None)
        if key is not None:
            self.task_finished(node, key, goto, sends)

    # ----------------------------------------------------------------- messages
    def hint(self, agent: str, within: str | None = None) -> KVFlowHint:
        """The hint of an LLM call by ``agent`` now (fixed prefix: the leading system message).

        ``within``: the agent of the node ``agent`` runs inside (``agent`` is then a node of a
        subgraph, named by its path): it has that agent's steps, in this hint and in every update.
        """
        self.announced = True
        if within is not None and agent not in self._inner and len(self._inner) < _MAX_INNER:
            self._inner[agent] = within
        return self.hints.hint(self, agent if within is None or agent in self._inner else within, fixed_prefix=1)

    def agent_steps(self) -> dict[str, float]:
        """The tracker's steps per agent, plus those of the subgraph agents seen so far."""
        steps = self.tracker.agent_steps()
        for agent, within in self._inner.items():
            steps[agent] = steps.get(within, math.inf)
        return steps

    def update(self, *, done: bool = False) -> Snapshot:
        """The steps to post now (built into a StepsUpdate when sent); done still carries them."""
        return Snapshot(self.hints, self.agent_steps(), done)

    # ----------------------------------------------------------------- helpers
    def _apply(self, what: str, op, *args) -> bool:
        try:
            op(*args)
            return True
        except WorkflowError as exc:
            self._warn(what, f"workflow {self.workflow_id!r}: {exc}; steps may be stale until the run ends")
            return False

    def _warn(self, key: str, message: str) -> None:
        warn_once(self._warned, key.split(":")[0], message)


def warn_once(warned: set[str], kind: str, message: str) -> None:
    """One :class:`TrackingWarning` per ``kind`` and graph (``warned``); standard filters apply."""
    if kind not in warned:
        warned.add(kind)
        warnings.warn(message, TrackingWarning, stacklevel=3)
