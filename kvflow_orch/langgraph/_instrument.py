"""``instrument(app)``: attach kvflow's workflow tracking to a compiled LangGraph graph."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from langchain_core.runnables.config import var_child_runnable_config

from ..clients.gateway import Routing
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
    workers: Sequence[str] | None = None,
    routing: Routing | None = None,
    branch_stats: Any = None,
) -> Any:
    """Return a copy of ``compiled_graph`` that tracks its runs with a :class:`KVFlowCallbackHandler`.

    The copy keeps every attribute of the original and its class is a subclass of the original's
    whose ``stream``/``astream`` (what invoke, batch, their async forms and event streaming run on)
    add the handler to each call's callbacks. Nothing is bound into the graph's config, so return
    types, snapshot configs, checkpoints and time travel behave as without kvflow. LLM requests
    inside its nodes carry hints when made through :func:`http_client` / :func:`async_http_client`.
    ``backend_url`` is the kvflow server that receives out-of-band steps updates, its root or its
    ``/v1`` base URL (default: the first kvflow server an LLM request reaches), or a gateway in front
    of many kvflow workers (SGLang's ``smg``): ``backend_url`` the gateway plus ``workers`` (the worker
    URLs), or ``backend_url="smg+http://HOST:PORT"`` to read them from the gateway's ``GET /workers``.
    Behind a gateway ``routing`` groups calls on workers by the ``x-smg-routing-key`` header:
    ``"agent"`` (default, ``<namespace>/<agent>``), ``"workflow"`` (``<namespace>/<workflow_id>``) or
    ``"none"``; steps go to the workers that served the workflow, ``done`` to all. ``agents`` maps
    node -> agent identity (``None``: the node calls no LLM).
    ``branch_stats`` (a :class:`~kvflow_orch.BranchStats`): every routing decision (conditional
    edges, ``Command(goto=...)``, ``Send``) is learned into it and hints carry expected steps.
    """
    if not hasattr(compiled_graph, "stream") or not hasattr(compiled_graph, "__dict__"):
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
        backend=Backend(backend_url, workers=workers, routing=routing),
        branch_stats=branch_stats,
    )
    app = object.__new__(_tracked_class(type(compiled_graph), handler))
    app.__dict__.update(compiled_graph.__dict__)
    return app


def _tracked_class(cls: type, handler: KVFlowCallbackHandler) -> type:
    """A subclass of ``cls`` whose runs carry ``handler`` (kept by LangGraph's own copies)."""

    def stream(self, input, config=None, **kwargs):
        return cls.stream(self, input, with_handler(config, handler), **kwargs)

    def astream(self, input, config=None, **kwargs):
        return cls.astream(self, input, with_handler(config, handler), **kwargs)

    namespace = {
        "stream": stream,
        "astream": astream,
        "_kvflow_handler": handler,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    return type(cls.__name__, (cls,), namespace)


def with_handler(config: Any, handler: KVFlowCallbackHandler) -> dict[str, Any]:
    """``config`` with ``handler`` among its callbacks, once (time travel hands configs back).

    Without callbacks of its own a call inherits those of the run it is made in (LangGraph reads
    them from the context): they are kept, so traces stay linked. A graph called inside a node of
    another instrumented graph adds nothing: the outer graph tracks its runs, and the inner graph's
    nodes become agents named by their path (``outer_node/inner_node``).
    """
    config = dict(config or {})
    callbacks = config.get("callbacks")
    if callbacks is None:
        callbacks = (var_child_runnable_config.get() or {}).get("callbacks")
    handlers = callbacks if isinstance(callbacks, list) else getattr(callbacks, "handlers", [])
    if any(isinstance(h, KVFlowCallbackHandler) for h in handlers):
        return config
    if callbacks is None:
        config["callbacks"] = [handler]
    elif isinstance(callbacks, list):
        config["callbacks"] = [*callbacks, handler]
    else:
        callbacks = callbacks.copy()
        callbacks.add_handler(handler, inherit=True)
        config["callbacks"] = callbacks
    return config


def handler_of(app: Any) -> KVFlowCallbackHandler:
    """The handler :func:`instrument` attached to ``app`` (to flush its updates)."""
    handler = getattr(type(app), "_kvflow_handler", None)
    if isinstance(handler, KVFlowCallbackHandler):
        return handler
    raise ValueError("this graph was not instrumented by kvflow_orch.langgraph.instrument")
