"""``/metrics`` in the Prometheus text format (0.0.4, written by ``prometheus_client``): per-route
request counts and latencies recorded by :class:`MetricsMiddleware`, plus every numeric value of
``engine.stats()`` and of the traffic learner's counts (``kvflow_learner_<key>``).

Each app has its own ``CollectorRegistry`` (:attr:`ServerMetrics.registry`), so two servers in one
process never share series. Engine stats become ``kvflow_engine_<key>`` (nested keys joined by
``_``) typed as gauges: the brain's counters only ever grow, but occupancy does not, and a gauge is
correct for both. Paths outside the app's routes are counted under ``path="other"`` so a scanner
cannot blow up the number of series.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator, Mapping

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ServerMetrics", "MetricsMiddleware", "CONTENT_TYPE"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class ServerMetrics:
    """Thread-safe request counters; ``known_paths`` bounds the ``path`` label. A collector of its
    own per-app :attr:`registry`, which also reports ``engine_stats()``; :meth:`render` is the
    ``/metrics`` body."""

    def __init__(self, known_paths: Iterable[str] = (),
                 engine_stats: Callable[[], Mapping[str, Any]] = dict,
                 learner_stats: Callable[[], Mapping[str, Any]] = dict) -> None:
        self.known_paths = frozenset(known_paths)
        self.engine_stats = engine_stats
        self.learner_stats = learner_stats
        self._lock = threading.Lock()
        self._count: dict[tuple[str, str, int], int] = defaultdict(int)
        self._seconds: dict[tuple[str, str], float] = defaultdict(float)
        self._observed: dict[tuple[str, str], int] = defaultdict(int)
        self.in_flight = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def label(self, path: str) -> str:
        return path if path in self.known_paths else "other"

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1

    def end(self, method: str, path: str, status: int, seconds: float) -> None:
        path = self.label(path)
        method = method if method in _METHODS else "other"  # clients choose methods: bound the label too
        with self._lock:
            self.in_flight -= 1
            self._count[(method, path, status)] += 1
            self._seconds[(method, path)] += seconds
            self._observed[(method, path)] += 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts = sorted(self._count.items())
            durations = sorted((key, seconds, self._observed[key]) for key, seconds in self._seconds.items())
            in_flight = self.in_flight
        requests = CounterMetricFamily("kvflow_http_requests", "HTTP requests answered, by method, path and status.",
                                       labels=("method", "path", "status"))
        for (method, path, status), n in counts:
            requests.add_metric((method, path, str(status)), n)
        yield requests
        duration = SummaryMetricFamily("kvflow_http_request_duration_seconds",
                                       "Time from request to the end of its response.", labels=("method", "path"))
        for labels, seconds, n in durations:
            duration.add_metric(labels, count_value=n, sum_value=seconds)
        yield duration
        yield GaugeMetricFamily("kvflow_http_requests_in_flight", "Requests being served now.", value=in_flight)
        flat: dict[str, float] = {}
        _flatten("kvflow_engine", self.engine_stats(), flat)
        for name, value in sorted(flat.items()):
            yield GaugeMetricFamily(name, "engine.stats() value.", value=value)
        learned: dict[str, float] = {}
        _flatten("kvflow_learner", self.learner_stats(), learned)
        for name, value in sorted(learned.items()):
            yield GaugeMetricFamily(name, "traffic learner count (/kvflow/v1/stats learner).", value=value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 499  # nginx's "client closed request": what is left if no response ever started

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        self.metrics.begin()
        try:
            await self.app(scope, receive, recording_send)
        except BaseException:
            status = 500 if status == 499 else status
            raise
        finally:
            self.metrics.end(scope["method"], scope["path"], status, time.perf_counter() - started)


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, (int, float)):  # bool included: a flag becomes 0/1
        out[prefix] = float(value)
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            _flatten(f"{prefix}_{_NAME_BAD.sub('_', str(key))}", inner, out)
