"""The callback handler that follows an instrumented LangGraph app, one workflow per run.

LangGraph reports every run to the callbacks of the call (``instrument`` adds this handler to each
call's callbacks). No handler method raises: a failure costs hints and one TrackingWarning.

* the **root** run is the graph itself (a chain run named like the graph whose parent we never
  saw); its workflow id is ``metadata["kvflow_workflow_id"]``, else the thread id, else the root
  run id (also when the chosen id is one the protocol refuses, with a TrackingWarning). Runs
  sharing a workflow id share one :class:`LiveWorkflow`;
* a **node task** is a direct child of the root whose ``langgraph_node`` metadata equals its name
  and that carries the tag ``graph:step:N``;
* a **branch** run is a direct child of a node task tagged ``seq:step:K`` with K past the node's
  body steps and its write step (:meth:`Routes.branch_at`); its output is the router's choice. A
  node's own ``Command`` output carries its ``goto``; a ``Command.PARENT`` raised out of a subgraph
  node ends that node's task with the command's ``goto``.

Decisions are complete when the node task ends, so that is when the tracker hears ``finish``.
Every run id is mapped to its root and node task, so an LLM request made anywhere inside a node
(also inside subgraphs or nested runnables) finds its workflow and agent from its parent run id.
A run that ended with ``interrupt()`` keeps its workflow (a resume continues it); every other end
forgets it. Each root's end sends ``done=true`` to the backend.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, TypeVar
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langgraph.errors import GraphInterrupt, ParentCommand
from langgraph.types import Command, Send

from ..constants import START
from ..protocol import DEFAULT_NAMESPACE, KVFlowHint, check_name
from ._backend import Backend
from ._compile import Routes
from ._live import LiveWorkflow, warn_once

__all__ = ["KVFlowCallbackHandler"]

_MAX_PAUSED = 1024
_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(method: _F) -> _F:
    """Tracking never raises into LangChain's callbacks: a failure costs hints, with one warning."""

    @functools.wraps(method)
    def guarded(self: "KVFlowCallbackHandler", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            warn_once(self._warned, "internal",
                      f"kvflow tracking failed ({type(exc).__name__}: {exc}); steps may be stale")
            return None

    return guarded  # type: ignore[return-value]
_ERROR_HANDLER = "__error_handler__"


@dataclass
class _Run:
    root: UUID
    task: UUID | None
    ns: str = ""
    """LangGraph's ``langgraph_checkpoint_ns`` of the run: the path of graph nodes it runs in."""


@dataclass
class _Task:
    node: str
    key: str
    branch_outputs: list[tuple[str, Any]] = field(default_factory=list)
    llm_calls: int = 0
    recovers: bool = False
    """An error handler's task: its end completes the failed task of ``node``."""


@dataclass
class _Root:
    workflow: LiveWorkflow
    interrupted: bool = False


class KVFlowCallbackHandler(BaseCallbackHandler):
    """Mirrors the node tasks of an instrumented graph onto one StepTracker per workflow."""

    run_inline = True  # async graphs call it inline, in order
    raise_error = False

    def __init__(
        self,
        asg: Any,
        routes: Mapping[str, Routes],
        *,
        graph_name: str,
        namespace: str | None,
        backend: Backend,
        branch_stats: Any = None,
    ) -> None:
        self.asg = asg
        self.branch_stats = branch_stats  # learns every routing decision when given
        self.routes = dict(routes)
        self.graph_name = graph_name
        self.namespace = namespace or DEFAULT_NAMESPACE
        self.backend = backend
        self._lock = threading.RLock()
        self._runs: dict[UUID, _Run] = {}
        self._tasks: dict[UUID, _Task] = {}
        self._branch_runs: dict[UUID, int] = {}
        self._roots: dict[UUID, _Root] = {}
        self._workflows: dict[str, tuple[LiveWorkflow, int]] = {}
        self._paused: OrderedDict[str, LiveWorkflow] = OrderedDict()
        self._warned: set[str] = set()  # warning kinds already shown for this graph

    # ----------------------------------------------------------------- run tree
    @_guarded
    def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, tags=None, metadata=None, **kw) -> None:
        md, name, tags = metadata or {}, kw.get("name"), tags or ()
        with self._lock:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
            if parent is None:
                if parent_run_id is None or name == self.graph_name:
                    self._begin_root(run_id, md)
                return
            if parent.task is None and parent_run_id == parent.root:
                node = md.get("langgraph_node")
                if node == name and f"graph:step:{md.get('langgraph_step')}" in tags:
                    self._begin_task(run_id, parent.root, node, md)
                    return
            elif parent_run_id == parent.task:
                # A router runs as a later step of its node's sequence (a node that is itself a
                # chain of runnables has numbered steps of its own first).
                task = self._tasks.get(parent.task)  # type: ignore[arg-type]
                routes = self.routes.get(task.node) if task is not None else None
                k = _seq_step(tags)
                branch = routes.branch_at(k) if routes is not None and k is not None else None
                if branch is not None:
                    self._branch_runs[run_id] = branch
            self._runs[run_id] = _Run(parent.root, parent.task, md.get("langgraph_checkpoint_ns") or parent.ns)

    @_guarded
    def on_chain_end(self, outputs, *, run_id, **kw) -> None:
        with self._lock:
            self._end(run_id, outputs, None)

    @_guarded
    def on_chain_error(self, error, *, run_id, **kw) -> None:
        with self._lock:
            self._end(run_id, None, error)

    # Other runs only extend the tree, so LLM calls and nested chains inside them find their node.
    @_guarded
    def _child(self, run_id: UUID, parent_run_id: UUID | None, metadata: Mapping[str, Any] | None) -> None:
        with self._lock:
            parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
            if parent is not None:
                ns = (metadata or {}).get("langgraph_checkpoint_ns") or parent.ns
                self._runs[run_id] = _Run(parent.root, parent.task, ns)

    def on_llm_start(self, serialized, prompts, *, run_id, parent_run_id=None, metadata=None, **kw) -> None:
        self._child(run_id, parent_run_id, metadata)

    def on_chat_model_start(self, serialized, messages, *, run_id, parent_run_id=None, metadata=None, **kw) -> None:
        self._child(run_id, parent_run_id, metadata)

    def on_tool_start(self, serialized, input_str, *, run_id, parent_run_id=None, metadata=None, **kw) -> None:
        self._child(run_id, parent_run_id, metadata)

    def on_retriever_start(self, serialized, query, *, run_id, parent_run_id=None, metadata=None, **kw) -> None:
        self._child(run_id, parent_run_id, metadata)

    @_guarded
    def _forget(self, *args: Any, run_id: UUID, **kw: Any) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    on_llm_end = on_llm_error = on_tool_end = on_tool_error = _forget
    on_retriever_end = on_retriever_error = _forget

    # ----------------------------------------------------------------- workflow lifecycle
    def _begin_root(self, run_id: UUID, md: Mapping[str, Any]) -> None:
        wid = str(md.get("kvflow_workflow_id") or md.get("thread_id") or run_id)
        try:
            check_name(wid, "workflow id")
        except ValueError as exc:  # every hint would fail, and with it the app's LLM request
            warn_once(self._warned, "workflow-id", f"{exc}; this run uses its root run id {run_id} instead")
            wid = str(run_id)
        live, count = self._workflows.get(wid, (None, 0))
        if live is None:
            live = self._paused.pop(wid, None) or LiveWorkflow(self.asg, wid, self.namespace, self._warned,
                                                               branch_stats=self.branch_stats)
        self._workflows[wid] = (live, count + 1)
        self._runs[run_id] = _Run(run_id, None)
        self._roots[run_id] = _Root(live)

    def _begin_task(self, run_id: UUID, root: UUID, node: str, md: Mapping[str, Any]) -> None:
        self._runs[run_id] = _Run(root, run_id)
        if node.startswith(_ERROR_HANDLER) and node[len(_ERROR_HANDLER):] in self.asg.nodes:
            self._tasks[run_id] = _Task(node[len(_ERROR_HANDLER):], "", recovers=True)
            return
        if node not in self.asg.nodes and not (node == START and START in self.routes):
            return  # START without a router, error handlers: not transitions of the step graph
        key = str(md.get("langgraph_checkpoint_ns") or run_id)
        self._tasks[run_id] = _Task(node, key)
        path = md.get("langgraph_path") or ()
        live = self._roots[root].workflow
        live.task_started(node, key, pushed=bool(path) and path[0] == "__pregel_push")
        if node != START and self.asg.agent_of(node) is None:
            self._post(live)

    def _end(self, run_id: UUID, outputs: Any, error: BaseException | None) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        branch = self._branch_runs.pop(run_id, None)
        if branch is not None and error is None:
            task = self._tasks.get(run.task)  # type: ignore[arg-type]
            if task is not None:
                task.branch_outputs.append((branch, outputs))
        elif run_id in self._tasks:
            self._end_task(run.root, self._tasks.pop(run_id), outputs, error)
        elif run_id in self._roots:
            self._end_root(run_id)

    def _end_task(self, root: UUID, task: _Task, outputs: Any, error: BaseException | None) -> None:
        live = self._roots[root].workflow
        if error is not None:
            handoff = _parent_command(error)
            if handoff is None:
                if _is_interrupt(error):
                    self._roots[root].interrupted = True
                return  # still running for the tracker: a retry or a resume re-runs this task
            outputs = handoff  # a subgraph handed off to this graph's nodes: the task is done
        goto, sends = _decisions(self.routes.get(task.node), task.branch_outputs, outputs)
        if self.branch_stats is not None and task.node in self.routes:  # conditional edges, Command, Send
            self.branch_stats.observe(self.asg.name, task.node, list(dict.fromkeys(goto)))
        if task.recovers:
            live.recover(task.node, goto, sends)
            self._post(live)
            return
        live.task_finished(task.node, task.key, goto, sends)
        # The backend hears of a router's choice, and of any node that sent no hinted request.
        silent = task.node != START and (task.llm_calls == 0 or self.asg.agent_of(task.node) is None)
        if goto or silent:
            self._post(live)

    def _end_root(self, run_id: UUID) -> None:
        root = self._roots.pop(run_id)
        live = root.workflow
        _, count = self._workflows[live.workflow_id]
        if count > 1:
            self._workflows[live.workflow_id] = (live, count - 1)
        else:
            del self._workflows[live.workflow_id]
            if root.interrupted:
                self._paused[live.workflow_id] = live
                while len(self._paused) > _MAX_PAUSED:
                    self._paused.popitem(last=False)
        self._post(live, done=True)

    # ----------------------------------------------------------------- hints and updates
    @_guarded
    def hint_for(self, run_id: UUID | None) -> KVFlowHint | None:
        """The hint for an LLM request made under ``run_id``; None outside a node of this graph."""
        with self._lock:
            run = self._runs.get(run_id) if run_id is not None else None
            task = self._tasks.get(run.task) if run is not None and run.task is not None else None
            if task is None or task.node == START:
                return None
            task.llm_calls += 1
            live = self._roots[run.root].workflow  # type: ignore[union-attr]
            agent = self.asg.agent_of(task.node) or task.node
            inner = _inner_nodes(task.key, run.ns)  # type: ignore[union-attr]
            return live.hint("/".join((agent, *inner)), agent) if inner else live.hint(agent)

    def knows(self, run_id: UUID | None) -> bool:
        with self._lock:
            return run_id in self._runs

    def _post(self, live: LiveWorkflow, *, done: bool = False) -> None:
        if self.backend.url is None or self.backend.probed() is False:
            return  # nowhere to send it: skip building the update
        self.backend.send(live.update(done=done), announced=live.announced)

    @property
    def open_runs(self) -> int:
        """Runs still being followed (0 once every invocation has ended)."""
        with self._lock:
            return len(self._runs)


def _seq_step(tags: Any) -> int | None:
    for tag in tags:
        if isinstance(tag, str) and tag.startswith("seq:step:"):
            try:
                return int(tag[len("seq:step:"):])
            except ValueError:
                return None
    return None


def _is_interrupt(error: BaseException) -> bool:
    return isinstance(error, GraphInterrupt)


def _inner_nodes(task_ns: str, run_ns: str) -> tuple[str, ...]:
    """The graph nodes between a node task (checkpoint namespace ``task_ns``) and a run inside it:
    ``("search",)`` for a request made by node ``search`` of a subgraph run by the task."""
    if not task_ns or not run_ns.startswith(task_ns + "|"):
        return ()
    return tuple(part.split(":")[0] for part in run_ns[len(task_ns) + 1 :].split("|") if part)


def _parent_command(error: BaseException) -> Any:
    """What a ``Command(graph=Command.PARENT)`` means for the task it ended, else None."""
    if not (isinstance(error, ParentCommand) and error.args and isinstance(error.args[0], Command)):
        return None
    command = error.args[0]
    # Raised by a node of this graph (graph=PARENT): it ends here and routes in the parent.
    return Command() if command.graph == Command.PARENT else Command(goto=command.goto)


def _decisions(routes: Routes | None, branch_outputs: list[tuple[str, Any]],
               outputs: Any) -> tuple[list[str], list[str]]:
    """(targets chosen, Send targets) of a finished node task."""
    goto: list[str] = []
    sends: list[str] = []

    def take(choice: Any, ends: Mapping[Any, str] | None) -> None:
        for item in choice if isinstance(choice, (list, tuple)) else (choice,):
            if isinstance(item, Send):
                goto.append(item.node)
                sends.append(item.node)
            elif isinstance(item, Hashable) and ends is not None and item in ends:
                goto.append(ends[item])
            elif isinstance(item, str):
                goto.append(item)

    if routes is not None:
        ends_of = dict(routes.branches)
        for name, choice in branch_outputs:
            take(choice, ends_of.get(name))
    for command in outputs if isinstance(outputs, (list, tuple)) else (outputs,):
        if isinstance(command, Command) and command.graph is None and command.goto:
            take(command.goto, None)
    return goto, sends
