"""Run a workflow: nodes as asyncio tasks driven by the Agent Step Graph tracker, with hints.

    from kvflow_orch import run
    result = run(wf, {"idea": "a todo app"}, backend="local:tiny-random")
    result.state["code"], result.trace

Execution model:

* A node starts as soon as the tracker says it is triggered; fan-out runs concurrently, AND-joins
  wait (the tracker keeps the arrival flags), a node may run again while a cycle retriggers it.
* When a node finishes, its update is merged into the state (see :mod:`kvflow_orch._state`), its
  routers run on the merged state, and the tracker learns what they chose.
* Every LLM call carries a :class:`KVFlowHint` with the steps of every agent at call time; when a
  non-LLM node starts or finishes, when a router chooses and when the run ends (done), an
  out-of-band steps update goes to the backend without blocking the workflow.
* Any failure (a node raising, a router returning an unknown key, the backend failing, more than
  ``max_steps`` node executions) raises a :class:`WorkflowError` naming the node; on failure and on
  cancellation every task of the run is cancelled and awaited before the error propagates, and the
  backend is told the workflow is done.

``backend`` forms are listed in :mod:`kvflow_orch.clients`. Plain (non-async) function nodes run on
the event loop, so keep them short; plain-function *custom agents* run in a worker thread so that
``ctx.llm_sync`` can block.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import os
import time
import uuid
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from ._state import StateStore
from ._threads import run_in_thread
from .asg import AgentStepGraph
from .branch_stats import BranchStats
from .clients import BackendError, LLMClient, open_client
from .constants import END, START
from .context import AgentContext
from .errors import WorkflowError
from .hinting import WorkflowHints
from .nodes import AgentNode, CustomAgentNode, FunctionNode, render_prompt
from .protocol import DEFAULT_NAMESPACE, CallRecord, KVFlowHint, NodeRecord, check_name

__all__ = ["RunResult", "NodeEvent", "run", "arun", "run_many", "arun_many"]


class RunResult(NamedTuple):
    state: dict[str, Any]
    trace: tuple[NodeRecord, ...]
    """One record per node execution, in finishing order."""
    calls: tuple[CallRecord, ...]
    """One record per LLM call, in finishing order (what ``kvflow run --record`` writes)."""
    workflow_id: str


class NodeEvent(NamedTuple):
    """Progress report passed to ``on_event``: ``kind`` is "start" or "finish"."""

    kind: str
    workflow_id: str
    node: str
    agent: str | None
    record: NodeRecord | None


def _compile(workflow: Any) -> AgentStepGraph:
    if isinstance(workflow, AgentStepGraph):
        return workflow
    if hasattr(workflow, "compile") and hasattr(workflow, "add_agent"):
        return workflow.compile()
    raise WorkflowError(f"run() needs a Workflow or an AgentStepGraph, got {type(workflow).__name__}")


class _Execution:
    """One workflow instance in flight (the :class:`~kvflow_orch.context.AgentRun` of its contexts)."""

    def __init__(self, asg: AgentStepGraph, client: LLMClient, workflow_id: str, namespace: str, max_steps: int,
                 on_event, branch_stats: BranchStats | None = None) -> None:
        self.asg = asg
        self.branch_stats = branch_stats
        self.client = client
        self.workflow_id = workflow_id
        self.namespace = namespace
        self.max_steps = max_steps
        self.on_event = on_event
        self.tracker = asg.tracker(branch_stats)
        self.hints = WorkflowHints(workflow_id, namespace)
        self.t0 = time.perf_counter()
        self.clock = 0
        self.executions: collections.Counter[str] = collections.Counter()
        self.trace: list[NodeRecord] = []
        self.calls: list[CallRecord] = []

    # --------------------------------------------------------------- hints
    def hint_for(self, agent: str) -> KVFlowHint:
        # fixed_prefix=1: every call is [system (the agent's fixed prompt), user (dynamic)].
        return self.hints.hint(self.tracker, agent, fixed_prefix=1)

    def send_steps(self, done: bool = False) -> None:
        self.client.send_steps(self.hints.update(None if done else self.tracker, done=done))

    # --------------------------------------------------------------- routing
    async def route(self, node: str, state: Mapping[str, Any]) -> list[str] | None:
        branches = self.asg.branches_of(node)
        if not branches:
            return None
        chosen: list[str] = []
        for branch in branches:
            try:
                picked = branch.router(state)
                if inspect.isawaitable(picked):
                    picked = await picked
            except Exception as exc:
                raise WorkflowError(f"router of node {node!r} raised {type(exc).__name__}: {exc}") from exc
            items = picked if isinstance(picked, (list, tuple)) else [picked]
            for item in items:
                chosen.append(_target(node, branch, item))
        chosen = list(dict.fromkeys(chosen))
        if self.branch_stats is not None:
            self.branch_stats.observe(self.asg.name, node, chosen)
        return chosen

    # --------------------------------------------------------------- nodes
    async def execute(self, name: str, state: dict[str, Any]) -> tuple[Any, AgentContext | None]:
        node = self.asg.nodes[name]
        try:
            if isinstance(node, FunctionNode):
                result = node.fn(state)
                if inspect.isawaitable(result):
                    result = await result
                return result, None
            ctx = AgentContext(self, name, node.agent, node.system, node.sampling, state)
            if isinstance(node, AgentNode):
                text = await ctx.llm(render_prompt(node, state))
                return ({node.output: text} if node.output else None), ctx
            if isinstance(node, CustomAgentNode):
                if inspect.iscoroutinefunction(node.fn):
                    return await node.fn(ctx, ctx.state), ctx
                return await run_in_thread(node.fn, ctx, ctx.state, on_cancel=ctx.cancel_calls), ctx
            raise WorkflowError(f"node {name!r} has an unknown kind {type(node).__name__}")
        except WorkflowError:
            raise
        except BackendError as exc:
            raise WorkflowError(f"node {name!r}: LLM call failed: {exc}") from exc
        except Exception as exc:
            raise WorkflowError(f"node {name!r} raised {type(exc).__name__}: {exc}") from exc

    def _loop_names(self) -> str:
        repeated = [n for n, c in self.executions.most_common() if c > 1]
        return " -> ".join(repeated or list(self.executions))

    async def drive(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        store = StateStore(inputs, self.asg.reducers)
        tracker = self.tracker
        if self.asg.branches_of(START):
            tracker.finish(START, goto=await self.route(START, store.values))
        running: dict[asyncio.Task, tuple[str, int, float]] = {}
        try:
            while True:
                for name in sorted(tracker.triggered):
                    self._start(name, store, running)
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: running[t][1]):
                    name, started, t_start = running.pop(task)
                    update, ctx = task.result()
                    self.clock += 1
                    store.merge(name, update, started, self.clock)
                    goto = await self.route(name, store.values)
                    tracker.finish(name, goto=goto)
                    self._record(name, t_start, ctx)
                    if goto is not None or self.asg.agent_of(name) is None:
                        self.send_steps()
        finally:
            await _cancel_all(running)
        return store.values

    def _start(self, name: str, store: StateStore, running: dict) -> None:
        self.executions[name] += 1
        if sum(self.executions.values()) > self.max_steps:
            raise WorkflowError(
                f"workflow {self.asg.name!r} exceeded max_steps={self.max_steps} node executions; "
                f"the loop that kept running: {self._loop_names()} (node {name!r} was about to run "
                f"again); make its router reach END or raise max_steps"
            )
        self.tracker.start(name)
        self.clock += 1
        agent = self.asg.agent_of(name)
        if agent is None:
            self.send_steps()
        if self.on_event is not None:
            self.on_event(NodeEvent("start", self.workflow_id, name, agent, None))
        task = asyncio.get_running_loop().create_task(self.execute(name, store.snapshot()), name=f"kvflow:{name}")
        running[task] = (name, self.clock, time.perf_counter() - self.t0)

    def _record(self, name: str, t_start: float, ctx: AgentContext | None) -> None:
        calls = ctx.calls if ctx is not None else []
        record = NodeRecord(
            node=name,
            agent=self.asg.agent_of(name),
            start=t_start,
            end=time.perf_counter() - self.t0,
            prompt_tokens=sum(c.prompt_tokens for c in calls),
            completion_tokens=sum(c.completion_tokens for c in calls),
            cached_tokens=sum(c.cached_tokens for c in calls),
            llm_calls=len(calls),
        )
        self.trace.append(record)
        self.calls.extend(calls)
        if self.on_event is not None:
            self.on_event(NodeEvent("finish", self.workflow_id, name, record.agent, record))


def _target(node: str, branch: Any, item: Any) -> str:
    try:
        if item in branch.path_map:
            return branch.path_map[item]
    except TypeError:  # unhashable router result
        pass
    if item == END or item in branch.targets:
        return item
    raise WorkflowError(
        f"router of node {node!r} returned {item!r}, which is neither a key of its path_map "
        f"{sorted(map(str, branch.path_map))} nor one of its targets {sorted(branch.targets)}"
    )


async def _cancel_all(tasks: Iterable[asyncio.Task]) -> None:
    tasks = list(tasks)
    for task in tasks:  # finished alongside the failure: their outcome is moot, mark it seen
        if task.done() and not task.cancelled():
            task.exception()
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def arun(
    workflow: Any,
    inputs: Mapping[str, Any] | None = None,
    *,
    backend: Any = "local",
    workflow_id: str | None = None,
    namespace: str | None = None,
    max_steps: int = 100,
    on_event: Callable[[NodeEvent], None] | None = None,
    branch_stats: BranchStats | None = None,
) -> RunResult:
    """Run one workflow instance; see the module docstring. ``workflow`` is a Workflow or its ASG.

    ``branch_stats``: learn every routing decision into it and send expected steps (see
    :mod:`kvflow_orch.branch_stats`); without it, ``KVFLOW_BRANCH_STATS=path`` loads the stats from
    that file (fresh ones if it does not exist) and saves them back when the run ends; with
    neither, steps are static."""
    asg = _compile(workflow)
    if not isinstance(max_steps, int) or max_steps <= 0:
        raise WorkflowError(f"max_steps must be a positive integer, got {max_steps!r}")
    workflow_id = workflow_id or f"{asg.name}-{uuid.uuid4().hex[:12]}"
    namespace = namespace or DEFAULT_NAMESPACE
    # Checked here, not by the first hint: the run would fail mid-way, and again in `finally`
    # when the done update is built, masking the first error and leaving the client open.
    for what, value in (("workflow_id", workflow_id), ("namespace", namespace)):
        try:
            check_name(value, what)
        except ValueError as exc:
            raise WorkflowError(str(exc)) from None
    stats, save_to = _branch_stats(branch_stats)
    opened = open_client(backend)
    run_ = _Execution(asg, opened.client, workflow_id, namespace, max_steps, on_event, stats)
    try:
        state = await run_.drive(inputs or {})
    finally:
        run_.send_steps(done=True)
        if save_to is not None:
            stats.save(save_to)
        if opened.owned:
            await opened.client.aclose()
        else:
            await opened.client.flush()
    return RunResult(state, tuple(run_.trace), tuple(run_.calls), run_.workflow_id)


BRANCH_STATS_ENV = "KVFLOW_BRANCH_STATS"


def _branch_stats(given: BranchStats | None) -> tuple[BranchStats | None, str | None]:
    """The stats a run uses and the file to save them to (``KVFLOW_BRANCH_STATS``, when not given)."""
    if given is not None:
        if not isinstance(given, BranchStats):
            raise WorkflowError(f"branch_stats must be a BranchStats, got {type(given).__name__}")
        return given, None
    path = os.environ.get(BRANCH_STATS_ENV)
    if not path:
        return None, None
    try:
        return (BranchStats.load(path) if os.path.exists(path) else BranchStats()), path
    except (OSError, ValueError) as exc:
        raise WorkflowError(f"{BRANCH_STATS_ENV}={path}: {exc}") from None


def _no_running_loop(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise WorkflowError(f"{name}() was called inside a running event loop; use 'await a{name}(...)' there")


def run(
    workflow: Any,
    inputs: Mapping[str, Any] | None = None,
    *,
    backend: Any = "local",
    workflow_id: str | None = None,
    namespace: str | None = None,
    max_steps: int = 100,
    on_event: Callable[[NodeEvent], None] | None = None,
    branch_stats: BranchStats | None = None,
) -> RunResult:
    """Blocking :func:`arun` (starts its own event loop; call :func:`arun` inside async code)."""
    _no_running_loop("run")
    return asyncio.run(arun(workflow, inputs, backend=backend, workflow_id=workflow_id, namespace=namespace,
                            max_steps=max_steps, on_event=on_event, branch_stats=branch_stats))


async def arun_many(
    workflow: Any,
    inputs: Sequence[Mapping[str, Any]],
    *,
    backend: Any = "local",
    namespace: str | None = None,
    max_steps: int = 100,
    on_event: Callable[[NodeEvent], None] | None = None,
    branch_stats: BranchStats | None = None,
) -> list[RunResult]:
    """Run one instance per input concurrently over one shared backend; results in input order.

    If one instance fails, the others are cancelled and the first error is raised. The instances
    share ``branch_stats`` (or the ``KVFLOW_BRANCH_STATS`` file's, saved once at the end).
    """
    asg = _compile(workflow)
    stats, save_to = _branch_stats(branch_stats)
    opened = open_client(backend)
    try:
        tasks = [
            asyncio.ensure_future(
                arun(asg, inp, backend=opened.client, namespace=namespace, max_steps=max_steps, on_event=on_event,
                     branch_stats=stats)
            )
            for inp in inputs
        ]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            await _cancel_all(tasks)
    finally:
        if save_to is not None:
            stats.save(save_to)
        if opened.owned:
            await opened.client.aclose()


def run_many(workflow: Any, inputs: Sequence[Mapping[str, Any]], **kwargs: Any) -> list[RunResult]:
    """Blocking :func:`arun_many`."""
    _no_running_loop("run_many")
    return asyncio.run(arun_many(workflow, inputs, **kwargs))
