"""``instrument(app)``: attach kvflow's workflow tracking to a compiled LangGraph graph."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import WorkflowError
from ..protocol import check_name
from ._backend import Backend
from ._callbacks import KVFlowCallbackHandler
from ._compile import compile_with_routes

__all__ = ["instrument", "handler_of"]


def instrument(
    compiled_graph: Any,
    *,
    namespace: str | None = None,
    agents: Mapping[str, str | None] | None = None,
    backend_url: str | None = None,
    branch_stats: Any = None,
) -> Any:
    """Return ``compiled_graph`` with a :class:`KVFlowCallbackHandler` attached.

    The result is still a compiled LangGraph graph (``with_config(callbacks=...)``): invoke, stream,
    batch and their async forms work unchanged. LLM requests inside its nodes carry hints when made
    through :func:`http_client` / :func:`async_http_client`. ``backend_url`` is the kvflow server
    that receives out-of-band steps updates (default: the first kvflow server an LLM request
    reaches); ``agents`` maps node -> agent identity (``None``: the node calls no LLM).
    ``branch_stats`` (a :class:`~kvflow_orch.BranchStats`): every routing decision (conditional
    edges, ``Command(goto=...)``, ``Send``) is learned into it and hints carry expected steps.
    """
    if not hasattr(compiled_graph, "with_config"):
        raise WorkflowError(
            f"instrument() needs a compiled LangGraph graph, got {type(compiled_graph).__name__}: "
            f"call graph.compile() first"
        )
    if namespace:
        check_name(namespace, "namespace")
    asg, routes = compile_with_routes(compiled_graph, agents)
    config = getattr(compiled_graph, "config", None) or {}
    handler = KVFlowCallbackHandler(
        asg,
        routes,
        graph_name=config.get("run_name") or getattr(compiled_graph, "name", None) or "LangGraph",
        namespace=namespace,
        backend=Backend(backend_url),
        branch_stats=branch_stats,
    )
    return compiled_graph.with_config(callbacks=[handler])


def handler_of(app: Any) -> KVFlowCallbackHandler:
    """The handler :func:`instrument` attached to ``app`` (to flush or close its updates)."""
    callbacks = (getattr(app, "config", None) or {}).get("callbacks") or []
    for handler in getattr(callbacks, "handlers", callbacks):
        if isinstance(handler, KVFlowCallbackHandler):
            return handler
    raise ValueError("this graph was not instrumented by kvflow_orch.langgraph.instrument")
