"""``/metrics`` in the Prometheus text format (0.0.4), written by hand: per-route request counts and
latencies recorded by :class:`MetricsMiddleware`, plus every numeric value of ``engine.stats()``.

Engine stats become ``kvflow_engine_<key>`` (nested keys joined by ``_``) typed as gauges: the
brain's counters only ever grow, but occupancy does not, and a gauge is correct for both.
Paths outside the app's routes are counted under ``path="other"`` so a scanner cannot blow up
the number of series.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import defaultdict
from typing import Any, Iterable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ServerMetrics", "MetricsMiddleware", "render_metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class ServerMetrics:
    """Thread-safe request counters; ``known_paths`` bounds the ``path`` label."""

    def __init__(self, known_paths: Iterable[str] = ()) -> None:
        self.known_paths = frozenset(known_paths)
        self._lock = threading.Lock()
        self._count: dict[tuple[str, str, int], int] = defaultdict(int)
        self._seconds: dict[tuple[str, str], float] = defaultdict(float)
        self._observed: dict[tuple[str, str], int] = defaultdict(int)
        self.in_flight = 0

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

    def snapshot(self) -> tuple[dict[tuple[str, str, int], int], dict[tuple[str, str], tuple[float, int]], int]:
        with self._lock:
            durations = {key: (self._seconds[key], self._observed[key]) for key in self._seconds}
            return dict(self._count), durations, self.in_flight


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


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, (int, float)):  # bool included: a flag becomes 0/1
        out[prefix] = float(value)
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            _flatten(f"{prefix}_{_NAME_BAD.sub('_', str(key))}", inner, out)


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


def render_metrics(metrics: ServerMetrics, engine_stats: Mapping[str, Any]) -> str:
    counts, durations, in_flight = metrics.snapshot()
    lines = [
        "# HELP kvflow_http_requests_total HTTP requests answered, by method, path and status.",
        "# TYPE kvflow_http_requests_total counter",
    ]
    for (method, path, status), n in sorted(counts.items()):
        lines.append(f'kvflow_http_requests_total{{method="{_esc(method)}",path="{_esc(path)}",status="{status}"}} {n}')
    lines += [
        "# HELP kvflow_http_request_duration_seconds Time from request to the end of its response.",
        "# TYPE kvflow_http_request_duration_seconds summary",
    ]
    for (method, path), (seconds, n) in sorted(durations.items()):
        labels = f'method="{_esc(method)}",path="{_esc(path)}"'
        lines.append(f"kvflow_http_request_duration_seconds_sum{{{labels}}} {seconds:.6f}")
        lines.append(f"kvflow_http_request_duration_seconds_count{{{labels}}} {n}")
    lines += [
        "# HELP kvflow_http_requests_in_flight Requests being served now.",
        "# TYPE kvflow_http_requests_in_flight gauge",
        f"kvflow_http_requests_in_flight {in_flight}",
    ]
    flat: dict[str, float] = {}
    _flatten("kvflow_engine", engine_stats, flat)
    for name, value in sorted(flat.items()):
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name} {_number(value)}")
    return "\n".join(lines) + "\n"
