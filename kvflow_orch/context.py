"""``ctx``: what a custom agent sees while it runs.

``await ctx.llm(user_content, **sampling)`` sends ``[system (the agent's fixed prompt), user]``
with a hint carrying the steps of every agent *at the moment of the call*; ``ctx.llm_sync`` is the
same for agents written as plain functions (the runtime runs those in a worker thread).
``ctx.state`` is a read-only snapshot taken when the node started; ``ctx.node`` its name.

A context belongs to an :class:`AgentRun`: the run's identity, its clock, its LLM client and its
hint for an agent now (the runtime's workflow execution is one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from .errors import WorkflowError
from .protocol import CallRecord, KVFlowHint, Sampling

if TYPE_CHECKING:
    from .clients.base import LLMClient

__all__ = ["AgentContext", "AgentRun"]


class AgentRun(Protocol):
    """The run an :class:`AgentContext` calls the LLM for."""

    workflow_id: str
    namespace: str
    t0: float
    """``time.perf_counter()`` when the run began: call offsets count from it."""
    client: LLMClient

    def hint_for(self, agent: str) -> KVFlowHint:
        """The hint of a call by ``agent`` now (the steps of every agent at this moment)."""
        ...

_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(Sampling))


class AgentContext:
    def __init__(self, run: AgentRun, node: str, agent: str, system: str, sampling: Sampling,
                 state: dict[str, Any]) -> None:
        """``state``: the snapshot the runtime took for this execution; nothing else holds it."""
        self._run = run
        self.node = node
        self.agent = agent
        self.system = system
        self.state: Mapping[str, Any] = MappingProxyType(state)  # the runtime's own snapshot: no copy
        self._sampling = sampling
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.calls: list[CallRecord] = []
        self._sync_calls: set[concurrent.futures.Future[str]] = set()

    async def llm(self, content: str, **sampling: Any) -> str:
        """One LLM call as this agent; returns the reply text."""
        if not isinstance(content, str):
            raise WorkflowError(f"node {self.node!r}: ctx.llm needs the user content as a string, "
                                f"got {type(content).__name__}")
        unknown = set(sampling) - _SAMPLING_FIELDS
        if unknown:
            raise WorkflowError(f"node {self.node!r}: unknown sampling options {sorted(unknown)}; "
                                f"allowed: {sorted(_SAMPLING_FIELDS)}")
        params = dataclasses.replace(self._sampling, **sampling) if sampling else self._sampling
        messages = ({"role": "system", "content": self.system}, {"role": "user", "content": content})
        hint = self._run.hint_for(self.agent)
        sent_at, began = time.time(), time.perf_counter()
        reply = await self._run.client.chat(messages, params, hint)
        ended = time.perf_counter()
        self.calls.append(
            CallRecord(
                time=sent_at,
                offset_s=began - self._run.t0,
                duration_s=ended - began,
                workflow_id=self._run.workflow_id,
                namespace=self._run.namespace,
                node=self.node,
                agent=self.agent,
                hint=hint.model_dump(mode="json") if self._run.client.supports_hints else None,
                prompt_tokens=reply.prompt_tokens,
                fixed_tokens=reply.fixed_tokens,
                completion_tokens=reply.completion_tokens,
                cached_tokens=reply.cached_tokens,
            )
        )
        return reply.text

    def llm_sync(self, content: str, **sampling: Any) -> str:
        """Blocking twin of :meth:`llm` for agents written as plain (non-async) functions."""
        if threading.get_ident() == self._loop_thread:
            raise WorkflowError(
                f"node {self.node!r}: ctx.llm_sync was called on the event loop; write the agent as "
                f"'async def' and use 'await ctx.llm(...)'"
            )
        future = asyncio.run_coroutine_threadsafe(self.llm(content, **sampling), self._loop)
        self._sync_calls.add(future)
        try:
            return future.result()
        finally:
            self._sync_calls.discard(future)

    def cancel_calls(self) -> None:
        """Cancel the LLM calls a worker thread is blocked on (the run is being cancelled)."""
        for future in list(self._sync_calls):
            future.cancel()
