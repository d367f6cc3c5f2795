"""What a server's ``GET /kvflow/v1/info`` answer means for a client, without doing any I/O.

A JSON object there (HTTP 200) is a kvflow server (the embedded server, the SGLang or the vLLM
plugin): requests carry the hint where its ``hints.openai`` says
(:func:`~kvflow_orch.protocol.hint_location`) and steps updates go to ``POST /kvflow/v1/steps``.
Anything else is a plain OpenAI-compatible server: no hints, no updates, and one
:class:`PlainServerWarning`. Behind a gateway the workers answer (the gateway itself has no kvflow
routes): the gateway is kvflow when one of them is, and the hint goes where every kvflow worker
reads it, since any of them may get the request.

The clients (:class:`~.http.HttpClient`, :class:`~.gateway.GatewayClient`, the LangGraph
backend) do the requests; :func:`read_info` and :func:`read_worker_infos` decide.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from ..protocol import CUSTOM_PARAMS, INFO_ROUTE, HintLocationError, hint_location

__all__ = ["PlainServerWarning", "InfoAnswer", "ServerProbe", "read_info", "read_worker_infos", "workers_unknown"]

_REFUSED = frozenset({401, 403})  # a server that wants an API key: kvflow perhaps, but not to us


class PlainServerWarning(RuntimeWarning):
    """The LLM server has no kvflow routes; requests go out without hints."""


class InfoAnswer(NamedTuple):
    """One ``GET /kvflow/v1/info``: the HTTP status (None: no answer) and the body parsed as JSON
    (None: not JSON)."""

    url: str
    status: int | None
    body: Any = None

    @property
    def info(self) -> dict[str, Any] | None:
        """The kvflow info, when this answer is one."""
        return self.body if self.status == 200 and isinstance(self.body, dict) else None


class ServerProbe(NamedTuple):
    """What a client does with a server, as its info answer(s) say."""

    kvflow: bool
    """Send hints and steps updates."""
    hint_location: str = CUSTOM_PARAMS
    """Where chat bodies carry the hint."""
    model: str | None = None
    """The model a kvflow info names (None: ask ``/v1/models``)."""
    refused: int | None = None
    """The status of a server that refused the probe (401/403): it needs an API key."""
    warning: str | None = None
    """Why requests carry no hints (the text of one :class:`PlainServerWarning`); None for kvflow."""
    location_error: str | None = None
    """The server names only hint locations this client does not know: no request may go out,
    since it would silently carry no hint (the message names both lists)."""


def read_info(answer: InfoAnswer) -> ServerProbe:
    """The probe of one server from its info answer."""
    info = answer.info
    if info is not None:
        return _kvflow(answer.url, [info])
    if answer.status in _REFUSED:
        why = f"refused {INFO_ROUTE} with HTTP {answer.status} (set KVFLOW_API_KEY to its API key)"
        return ServerProbe(False, refused=answer.status, warning=_no_hints(answer.url, why))
    if answer.status is None:
        return ServerProbe(False, warning=_no_hints(answer.url, f"did not answer {INFO_ROUTE} (unreachable)"))
    return ServerProbe(False, warning=_no_hints(answer.url, f"has no {INFO_ROUTE}: it is not a kvflow server"))


def read_worker_infos(gateway: str, answers: Sequence[InfoAnswer]) -> ServerProbe:
    """The probe of a gateway from its workers' info answers."""
    infos = [a.info for a in answers if a.info is not None]
    if infos:
        return _kvflow(gateway, infos)
    workers = ", ".join(a.url for a in answers)
    return ServerProbe(False, warning=_no_hints(gateway, f"is a gateway none of whose workers ({workers}) answers "
                                                         f"{INFO_ROUTE}"))


def workers_unknown(gateway: str, reason: object) -> ServerProbe:
    """The probe of a gateway whose workers could not be listed."""
    return ServerProbe(False, warning=_no_hints(gateway, f"is a gateway whose workers are unknown: {reason}"))


def _kvflow(url: str, infos: list[dict[str, Any]]) -> ServerProbe:
    model = infos[0].get("model")
    model = str(model) if model else None
    try:
        return ServerProbe(True, hint_location(*infos), model)
    except HintLocationError as exc:
        return ServerProbe(True, model=model, location_error=f"{url}{INFO_ROUTE}: {exc}")


def _no_hints(url: str, why: str) -> str:
    return f"{url} {why}, so requests carry no hints and the cache will not follow the workflow"
