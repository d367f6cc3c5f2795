"""Assembles the FastAPI application around a :class:`~backends.base.ServingEngine`.

Middleware order, outermost first: metrics (sees every answer, rejections included), Host/Origin
check (403 for a rebound name or a foreign web page), API key (rejects before any body is read),
JSON bodies only (415), body size (413 before parsing), then the routes.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Iterable

from fastapi import FastAPI
from fastapi.responses import Response

from backends.base import ServingEngine
from backends.learn import TrafficLearner
from backends.server.auth import APIKeyAuth, key_problem
from backends.server.crosssite import HostCheck, JSONBodiesOnly, host_names
from backends.server.debug import debug_router
from backends.server.errors import install_error_handlers
from backends.server.generate_routes import generate_router
from backends.server.kvflow_routes import StepsObserver, kvflow_router
from backends.server.learning import learned_router, learner_stats
from backends.server.limits import BodySizeLimit, ServerLimits
from backends.server.metrics import CONTENT_TYPE, MetricsMiddleware, ServerMetrics
from backends.server.openai_routes import openai_router
from backends.server.openapi import install_openapi
from backends.server.responses_routes import responses_router
from backends.server.serving import RequestObserver, ServerContext
from backends.server.worker_routes import worker_router

__all__ = ["create_app"]


def create_app(
    engine: ServingEngine,
    *,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    model_aliases: Iterable[str] = (),
    manage_engine: bool = True,
    on_request: RequestObserver | None = None,
    on_steps: StepsObserver | None = None,
    debug_routes: bool = False,
    learner: TrafficLearner | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> FastAPI:
    """Build the server app.

    ``api_key``: required on every route but ``/health`` when set. ``model_aliases``: extra names
    the ``model`` field may use besides ``engine.model_name``. ``manage_engine``: start the engine
    when the app starts and shut it down when it stops (its loop must be the server's loop).
    ``on_request``/``on_steps``: in-process observers of accepted requests and steps updates
    (for tests and tracing; they must not block). ``debug_routes``: mount ``/kvflow/v1/debug/*``
    (integrity check, hint-table size; see :mod:`backends.server.debug`); off by default.
    ``learner``: learn hints for requests that carry none (:mod:`backends.server.learning`); ``kvflow
    serve --learned-hints`` passes one.
    ``allowed_hosts``: the names the ``Host`` header (and a browser's ``Origin``) may carry;
    ``None`` accepts any Host and same-host origins only (:mod:`backends.server.crosssite`).
    Raises ValueError for an ``api_key`` no client can send (empty: every request would be refused).
    """
    problem = None if api_key is None else key_problem(api_key)
    if problem is not None:
        raise ValueError(problem)
    allowed = host_names(allowed_hosts)  # checked now: a bad name fails here, not at the first request
    ctx = ServerContext(
        engine=engine,
        limits=limits or ServerLimits(),
        model_names=frozenset({engine.model_name, *model_aliases}),
        observer=on_request,
        learner=learner,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_engine:
            await engine.start()
        try:
            yield
        finally:
            if manage_engine:
                await engine.shutdown()

    app = FastAPI(title="kvflow", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    routers = [openai_router(ctx), responses_router(ctx), generate_router(ctx), kvflow_router(ctx, on_steps),
               worker_router(ctx), learned_router(ctx)]
    if debug_routes:
        routers.append(debug_router(ctx))
    for router in routers:
        app.include_router(router)
    metrics = ServerMetrics(["/metrics", *(route.path for router in routers for route in router.routes)], engine.stats,
                            learner_stats=lambda: learner_stats(ctx))

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    install_openapi(app)

    # add_middleware wraps: the last added runs first.
    app.add_middleware(BodySizeLimit, limits=ctx.limits)
    app.add_middleware(JSONBodiesOnly)
    if api_key is not None:
        app.add_middleware(APIKeyAuth, api_key=api_key)
    app.add_middleware(HostCheck, allowed_hosts=allowed)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.state.kvflow = ctx
    return app
