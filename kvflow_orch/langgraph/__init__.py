"""kvflow for LangGraph apps: compile a graph into an Agent Step Graph, and instrument a compiled
graph so every LLM call made inside its nodes carries the workflow's steps-to-execution.

    from kvflow_orch.langgraph import instrument, http_client, async_http_client
    app = instrument(graph.compile(), namespace="my-app", backend_url="http://127.0.0.1:8000")
    llm = ChatOpenAI(base_url="http://127.0.0.1:8000/v1", http_client=http_client(),
                     http_async_client=async_http_client())
"""

from __future__ import annotations

from ..clients.probe import PlainServerWarning
from ._callbacks import KVFlowCallbackHandler
from ._compile import UndeclaredTargetsWarning, compile_langgraph
from ._delivery import Delivery, delivery
from ._instrument import handler_of, instrument
from ._live import TrackingWarning
from ._transport import AsyncKVFlowTransport, KVFlowTransport, async_http_client, http_client

__all__ = [
    "compile_langgraph",
    "instrument",
    "handler_of",
    "http_client",
    "async_http_client",
    "KVFlowCallbackHandler",
    "KVFlowTransport",
    "AsyncKVFlowTransport",
    "UndeclaredTargetsWarning",
    "PlainServerWarning",
    "TrackingWarning",
    "Delivery",
    "delivery",
]
