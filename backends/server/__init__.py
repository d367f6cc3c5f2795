"""The embedded engine's HTTP server: OpenAI- and SGLang-compatible routes plus kvflow's own.

    from backends.server import create_app
    app = create_app(engine, api_key="secret")     # a FastAPI app; serve it with uvicorn

Routes: ``/v1/chat/completions`` (SSE streaming), ``/v1/completions``, ``/v1/responses``, ``/v1/models``, ``/generate``,
``/kvflow/v1/info``, ``/kvflow/v1/steps``, ``/kvflow/v1/stats``, ``/health``, ``/metrics``, and the worker
routes a gateway probes (``/version``, ``/model_info``, ``/server_info``, ``/v1/loads``, ``/get_load``,
``/health_generate``, ``/flush_cache``; see :mod:`backends.server.worker_routes`).
Every error is ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.
"""

from __future__ import annotations

from backends.server.app import create_app
from backends.server.background import RunningServer, serve_in_thread
from backends.server.limits import ServerLimits

__all__ = ["create_app", "ServerLimits", "serve_in_thread", "RunningServer"]
