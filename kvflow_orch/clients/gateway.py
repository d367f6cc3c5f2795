"""LLM client for many kvflow workers behind a gateway (SGLang's model gateway, ``smg``).

Chat requests go to the gateway with the hint in the body, as to one server (at a location every
kvflow worker's ``/kvflow/v1/info`` names), plus a routing
header (``x-smg-routing-key``; smg's ``manual`` policy routes sticky by it) whose value groups the
calls that should share a worker:

* ``routing="agent"`` (default): ``<namespace>/<agent>``: an agent's fixed prompt stays on one
  worker, so each worker keeps only its share of all fixed prompts resident;
* ``routing="workflow"``: ``<namespace>/<workflow_id>``: a workflow stays on one worker (its agents'
  prompts then live on every worker, but one hot agent's calls spread over all of them);
* ``routing="none"``: no header (the gateway's own policy decides).

Steps updates cannot pass the gateway (it answers 404 for ``/kvflow/v1/*``): they go straight to
the workers through a :class:`~.steps_router.StepsRouter`, to those that served the workflow (the
gateway names the worker in ``x-smg-routed-worker-id``), ``done`` to all. The workers are given, or
read from the gateway's ``GET /workers`` on first use.

A worker lost mid-run: the gateway reroutes the retried request (connection failures and
502/503/504 are retried with backoff), the new worker gets the workflow's steps on first contact,
and a call that still fails raises a :class:`BackendError` naming the gateway and the worker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Iterable, Literal

import httpx

from ..protocol import INFO_ROUTE, KVFlowHint, Sampling, StepsUpdate
from .base import BackendError, LLMReply, Messages
from .http import HttpClient, HttpConfig, error_text, json_object, parse_completion
from .probe import InfoAnswer, read_worker_infos
from .registry import register_backend
from .steps_router import StepsRouter, StepsTarget

__all__ = ["GatewayConfig", "GatewayClient", "ROUTING_HEADER", "WORKER_HEADER", "Routing", "routing_key",
           "workers_from_listing"]

ROUTING_HEADER = "x-smg-routing-key"
WORKER_HEADER = "x-smg-routed-worker-id"
Routing = Literal["workflow", "agent", "none"]


@dataclass(frozen=True)
class GatewayConfig(HttpConfig):
    """:class:`HttpConfig` plus how calls are grouped on workers and where steps go."""

    retries: int = 6
    """More than one server's default: the gateway needs a few seconds to notice a lost worker."""
    backoff_s: float = 0.25
    routing: Routing = "agent"
    """How calls are grouped on workers (see the module docstring); ``agent`` kept the most fixed
    prompts resident in ``benchmarks/scaleout.py``, ``workflow`` spreads a hot agent's load."""
    steps_to: StepsTarget = "served"
    """``served``: steps to the workers that served the workflow; ``all``: to every worker."""
    hints: bool = True
    """False: send neither hints nor steps (a plain OpenAI client; the baseline of a benchmark)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.routing not in ("workflow", "agent", "none"):
            raise ValueError(f"routing must be 'workflow', 'agent' or 'none', got {self.routing!r}")


def routing_key(hint: KVFlowHint | None, routing: Routing) -> str | None:
    """The ``x-smg-routing-key`` value for a call carrying ``hint`` (``None``: send no header)."""
    if hint is None or routing == "none":
        return None
    return f"{hint.namespace}/{hint.workflow_id if routing == 'workflow' else hint.agent}"


def workers_from_listing(gateway: str, response: httpx.Response) -> list[str]:
    """The HTTP worker URLs of smg's ``GET /workers`` answer; a :class:`BackendError` naming
    ``gateway`` when the answer lists none."""
    data = json_object(response) if response.status_code == 200 else None
    if data is None or not isinstance(data.get("workers"), list):
        raise BackendError(gateway, f"cannot list the gateway's workers (GET /workers answered HTTP "
                                    f"{response.status_code}); pass the worker URLs instead")
    urls = [str(w["url"]) for w in data["workers"]
            if isinstance(w, dict) and str(w.get("url", "")).startswith(("http://", "https://"))]
    if not urls:
        raise BackendError(gateway, "the gateway lists no HTTP worker; pass the worker URLs instead")
    return urls


class GatewayClient(HttpClient):
    """Chat through the gateway at ``url``; steps to ``workers`` (empty: the gateway's worker list)."""

    def __init__(self, url: str, workers: Iterable[str] = (), config: GatewayConfig | None = None) -> None:
        config = config or GatewayConfig()
        super().__init__(url, config)
        self.config: GatewayConfig = config
        self.router = StepsRouter(workers, to=config.steps_to, timeout_s=config.connect_timeout_s,
                                  api_key=config.api_key)

    @property
    def workers(self) -> tuple[str, ...]:
        return self.router.workers

    async def _probe(self) -> None:
        if self._probed:
            return
        async with self._probe_lock:
            if self._probed:
                return
            if not self.router.workers:
                for url in await self._discover():
                    self.router.add_worker(url)
            answers = await asyncio.gather(*(self._worker_info(url) for url in self.router.workers))
            await self._learn(read_worker_infos(self.name, answers), hints=self.config.hints)

    async def _discover(self) -> list[str]:
        response = await self._request("GET", "/workers")
        return workers_from_listing(self.name, response)

    async def _worker_info(self, url: str) -> InfoAnswer:
        try:
            response = await self._http.get(url + INFO_ROUTE)
        except Exception:  # a worker down at start-up is found again by the gateway
            return InfoAnswer(url, None)
        return InfoAnswer(url, response.status_code, json_object(response))

    async def chat(self, messages: Messages, sampling: Sampling, hint: KVFlowHint | None) -> LLMReply:
        await self._probe()
        key = routing_key(hint, self.config.routing) if self.config.hints else None
        response = await self._post_chat(messages, sampling, hint, {ROUTING_HEADER: key} if key else None)
        worker = response.headers.get(WORKER_HEADER)
        if response.status_code != 200:
            via = f" via worker {worker}" if worker else ""
            raise BackendError(self.name, f"chat completion failed{via} with HTTP {response.status_code}: "
                                          f"{error_text(response)}")
        if worker and hint is not None and self._kvflow:
            self.router.served_by(hint.namespace, hint.workflow_id, worker)
        return parse_completion(response, f"{self.name} (worker {worker or 'unknown'})")

    async def _post_steps(self, update: StepsUpdate) -> None:
        self.router.send(update)  # in the order the runtime sent them, held ones first

    async def flush(self, timeout: float = 5.0) -> None:
        await super().flush(timeout)
        await self.router.flush(timeout)

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self.router.aclose()


def _open(backend: str | tuple) -> GatewayClient:
    if isinstance(backend, str):
        return GatewayClient(backend.removeprefix("smg+"))  # the workers come from GET /workers
    gateway, workers = backend
    if isinstance(workers, str) or not all(isinstance(w, str) for w in workers):
        raise ValueError("backend (GATEWAY_URL, WORKER_URLS): WORKER_URLS must be a list of URLs")
    return GatewayClient(gateway, workers)


def _is_gateway_pair(backend: object) -> bool:
    return isinstance(backend, tuple) and len(backend) == 2 and isinstance(backend[0], str)


register_backend("smg+http", _open, accepts=_is_gateway_pair)
register_backend("smg+https", _open)
