"""LLM client for any OpenAI-compatible server, kvflow-aware when the server says so.

On first use the client probes ``GET /kvflow/v1/info`` once. A JSON object there means a kvflow
server (the embedded server, the SGLang or the vLLM plugin): every chat request carries the hint
where that answer's ``hints.openai`` says (:func:`~kvflow_orch.protocol.hint_location`; top-level
``custom_params.kvflow`` for a server that names none, ``kv_transfer_params.kvflow`` for vLLM) and
steps updates go to ``POST /kvflow/v1/steps``; a server naming only locations this client does not
know is a :class:`BackendError` at the first call. Anything
else (404, not JSON) means a plain OpenAI-compatible server: no hints, no updates, one warning.

Connection failures (a server that went away before replying included) and 502/503/504 are
retried ``retries`` times with exponential backoff (:mod:`.retry`); then a :class:`BackendError`
names the URL. That is safe because a chat call is not streamed: nothing of a failed attempt
reached the caller. A read timeout is not retried. A reply that is not a chat completion is a
:class:`BackendError` too (the runtime adds the node's name).
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..protocol import CUSTOM_PARAMS, INFO_ROUTE, STEPS_ROUTE, KVFlowHint, Sampling, StepsUpdate, attach_hint
from .base import BackendError, LLMClient, LLMReply, Messages
from .outbox import Outbox
from .probe import InfoAnswer, PlainServerWarning, ServerProbe, read_info
from .registry import register_backend
from .retry import Retries

__all__ = ["HttpConfig", "HttpClient", "json_object", "error_text", "parse_completion"]

log = logging.getLogger("kvflow.runtime")


@dataclass(frozen=True)
class HttpConfig:
    """Connection policy of :class:`HttpClient`."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    retries: int = 3
    backoff_s: float = 0.2
    model: str | None = None
    """Model name sent in requests; default: the server's ``/kvflow/v1/info`` model, else the first
    of ``/v1/models``, else ``"default"``."""
    api_key: str | None = field(default_factory=lambda: os.environ.get("KVFLOW_API_KEY") or None)
    """Sent as ``Authorization: Bearer``; default: the ``KVFLOW_API_KEY`` environment variable."""

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0:
            raise ValueError("retries and backoff_s must be >= 0")


class HttpClient(LLMClient):
    def __init__(self, url: str, config: HttpConfig | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"backend URL must start with http:// or https://, got {url!r}")
        self.name = url.rstrip("/")
        self.config = config or HttpConfig()
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self._http_client: httpx.AsyncClient | None = None
        self._probe_lock = asyncio.Lock()
        self._probed = False
        self._kvflow = False
        self._hint_location = CUSTOM_PARAMS
        self._model = self.config.model
        # Held until the first call has probed whether the server takes updates at all.
        self._outbox = Outbox(self._post_steps, self.name, held=True)

    @property
    def supports_hints(self) -> bool:
        return self._kvflow

    @property
    def hint_location(self) -> str:
        """Where chat bodies carry the hint (learned from the server's info at the first call)."""
        return self._hint_location

    @property
    def _http(self) -> httpx.AsyncClient:
        """The connection pool of the running event loop.

        httpx's connections belong to the loop that opened them, and each blocking ``run()`` has
        a loop of its own: a client shared across ``run()`` calls opens a fresh pool per loop.
        """
        loop = asyncio.get_running_loop()
        if self._http_client is None or self._http_loop is not loop:
            config = self.config
            self._http_client = httpx.AsyncClient(
                base_url=self.name,
                timeout=httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s),
                headers={"Authorization": f"Bearer {config.api_key}"} if config.api_key else None,
            )
            self._http_loop = loop
        return self._http_client

    # ------------------------------------------------------------------ probing
    async def _probe(self) -> None:
        if self._probed:  # the lock is for the first calls only
            return
        async with self._probe_lock:
            if self._probed:
                return
            response = await self._request("GET", INFO_ROUTE)
            probe = read_info(InfoAnswer(self.name, response.status_code, json_object(response)))
            if probe.refused:
                raise BackendError(
                    self.name,
                    f"the server refused {INFO_ROUTE} with HTTP {probe.refused} ({error_text(response)}); "
                    f"give it its API key: KVFLOW_API_KEY=... or HttpConfig(api_key=...)",
                )
            await self._learn(probe)

    async def _learn(self, probe: ServerProbe, *, hints: bool = True) -> None:
        """Take the probe's answer (``hints=False``: send neither hints nor updates, warn of nothing)."""
        if hints and probe.location_error:
            raise BackendError(self.name, probe.location_error)
        if hints and probe.warning:
            warnings.warn(probe.warning, PlainServerWarning, stacklevel=3)
        self._kvflow = hints and probe.kvflow
        if self._kvflow:
            self._hint_location = probe.hint_location
        if self._model is None:
            self._model = probe.model or await self._first_model() or "default"
        self._probed = True
        if self._kvflow:
            self._outbox.release()
        else:
            self._outbox.discard()

    async def _first_model(self) -> str | None:
        response = await self._request("GET", "/v1/models")
        data = json_object(response) if response.status_code == 200 else None
        try:
            return str(data["data"][0]["id"])  # type: ignore[index]
        except (TypeError, KeyError, IndexError):
            return None

    # ------------------------------------------------------------------ calls
    async def chat(self, messages: Messages, sampling: Sampling, hint: KVFlowHint | None) -> LLMReply:
        await self._probe()
        response = await self._post_chat(messages, sampling, hint)
        if response.status_code != 200:
            raise BackendError(self.name,
                               f"chat completion failed with HTTP {response.status_code}: {error_text(response)}")
        return parse_completion(response, self.name)

    async def _post_chat(self, messages: Messages, sampling: Sampling, hint: KVFlowHint | None,
                         headers: dict[str, str] | None = None) -> httpx.Response:
        """POST the chat body (with the hint when the server takes hints); retried as :meth:`_request`."""
        body: dict[str, Any] = {"model": self._model, "messages": list(messages), **sampling.as_request()}
        if hint is not None and self._kvflow:
            body = attach_hint(body, hint, location=self._hint_location)
            self._outbox.announce(hint.namespace, hint.workflow_id)
        return await self._request("POST", "/v1/chat/completions", json=body, headers=headers)

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        retries = Retries(f"{method} {self.name}{path}", self.config.retries, self.config.backoff_s)
        while True:
            try:
                response = await self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:  # includes every timeout
                wait = retries.wait_after(exc)
                if wait is None:
                    raise BackendError(
                        self.name,
                        f"{method} {path} failed after {retries.attempts} attempts: {type(exc).__name__}: "
                        f"{exc or 'no reply'}",
                    ) from exc
            else:
                wait = retries.wait_after(response)
                if wait is None:
                    return response
            await asyncio.sleep(wait)

    # ------------------------------------------------------------------ steps
    def send_steps(self, update: StepsUpdate) -> None:
        if self._kvflow or not self._probed:  # held by the outbox until the probe says
            self._outbox.put(update)

    async def _post_steps(self, update: StepsUpdate) -> None:
        response = await self._http.post(STEPS_ROUTE, json=update.model_dump(mode="json"))
        if response.status_code >= 400:
            raise BackendError(self.name,
                               f"steps update rejected with HTTP {response.status_code}: {error_text(response)}")

    async def flush(self, timeout: float = 5.0) -> None:
        if self._outbox and not self._probed:
            try:
                await asyncio.wait_for(self._probe(), timeout)
            except (BackendError, asyncio.TimeoutError) as exc:
                log.warning("could not deliver steps updates to %s: %s", self.name, exc)
                self._outbox.discard()
        await self._outbox.flush(timeout)

    async def aclose(self) -> None:
        try:
            await self.flush()
        finally:
            await self._outbox.close(1.0)
            if self._http_client is not None and self._http_loop is asyncio.get_running_loop():
                await self._http_client.aclose()  # a pool of a loop that has ended is gone with it
            self._http_client = None


def json_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        data = response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def error_text(response: httpx.Response) -> str:
    data = json_object(response)
    if data is not None:
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        return str(err)[:500]
    return response.text[:500] or "(empty body)"


def parse_completion(response: httpx.Response, backend: str) -> LLMReply:
    data = json_object(response)
    try:
        if data is None:
            raise ValueError("the body is not a JSON object")
        content = data["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise ValueError("choices[0].message.content is not a string")
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        fixed = usage.get("fixed_prefix_tokens")  # a kvflow server's fixed-prefix boundary; absent elsewhere
        return LLMReply(
            text=content,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
            fixed_tokens=int(fixed) if isinstance(fixed, int) and not isinstance(fixed, bool) else None,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        snippet = response.text[:200].replace("\n", " ")
        raise BackendError(backend, f"reply is not a chat completion ({type(exc).__name__}: {exc}); "
                                    f"body starts {snippet!r}") from None


register_backend("http", HttpClient)
register_backend("https", HttpClient)
