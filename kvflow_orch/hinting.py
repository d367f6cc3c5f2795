"""The one place hints and steps updates are built from a workflow instance's tracker.

Every driver (the asyncio runtime, the LangGraph callback handler, the simulator) follows a
workflow with a tracker and tells the backend how far each agent is from running; this class turns
``tracker.agent_steps()`` into the protocol's messages, so the steps a backend sees do not depend
on which driver ran the workflow. Steps stay in their Python form (``math.inf``: not expected
again); the protocol models serialise them.
"""

from __future__ import annotations

from typing import Mapping, Protocol

from .protocol import DEFAULT_NAMESPACE, KVFlowHint, StepsUpdate

__all__ = ["StepsSource", "WorkflowHints"]


class StepsSource(Protocol):
    """What the builder reads from a tracker (``StepTracker`` and anything exposing the same)."""

    def agent_steps(self) -> Mapping[str, float]: ...


class WorkflowHints:
    """Hints and steps updates of one workflow instance.

    ``workflow_id`` and ``namespace`` are validated by the messages themselves (a bad id raises
    :class:`~kvflow_orch.protocol.HintError` on the first message).
    """

    __slots__ = ("workflow_id", "namespace")

    def __init__(self, workflow_id: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.workflow_id = workflow_id
        self.namespace = namespace

    def hint(self, tracker: StepsSource, agent: str, fixed_prefix: int | None = None) -> KVFlowHint:
        """The hint of an LLM call by ``agent``: the steps of every agent at call time."""
        return KVFlowHint(
            workflow_id=self.workflow_id,
            namespace=self.namespace,
            agent=agent,
            steps=tracker.agent_steps(),
            fixed_prefix=fixed_prefix,
        )

    def update(self, tracker: StepsSource | None = None, *, done: bool = False) -> StepsUpdate:
        """An out-of-band steps update; ``tracker=None`` sends no steps (enough for ``done``: the
        backend forgets the workflow whatever steps come with it)."""
        steps = tracker.agent_steps() if tracker is not None else {}
        return StepsUpdate(workflow_id=self.workflow_id, namespace=self.namespace, steps=steps, done=done)
