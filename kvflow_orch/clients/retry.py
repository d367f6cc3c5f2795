"""When kvflow's clients send a failed request again: one rule for the HTTP clients and the
LangGraph transport.

A request is sent again only when nothing of its answer reached the caller: the connection failed
or closed before a reply (a worker killed mid-request, a server restarting), or the reply is a
502/503/504, which a gateway answers when no worker could take the request. A read timeout is not
retried: the server has the request and is still on it, and a retry would double its work. The
waits double from ``backoff_s``; each retry is logged at INFO on ``kvflow.runtime``.
"""

from __future__ import annotations

import logging
from typing import Iterator

import httpx

__all__ = ["RETRY_STATUS", "Retries"]

log = logging.getLogger("kvflow.runtime")

RETRY_STATUS = frozenset({502, 503, 504})


class Retries:
    """The retries of one request: ``wait_after(outcome)`` is the seconds to wait before sending it
    again, or None when the outcome stands (a reply to return, an error to raise)."""

    def __init__(self, what: str, retries: int, backoff_s: float) -> None:
        self.what, self.retries, self.attempts = what, retries, 1
        self._waits: Iterator[float] = (backoff_s * 2**i for i in range(retries))

    def wait_after(self, outcome: httpx.Response | httpx.TransportError) -> float | None:
        if isinstance(outcome, httpx.Response):
            if outcome.status_code not in RETRY_STATUS:
                return None
            why = f"HTTP {outcome.status_code}"
        elif isinstance(outcome, httpx.ReadTimeout):
            return None
        else:
            why = f"{type(outcome).__name__}: {outcome or 'no reply'}"
        wait = next(self._waits, None)
        if wait is not None:
            log.info("%s failed (%s); retry %d of %d in %.2f s", self.what, why, self.attempts, self.retries, wait)
            self.attempts += 1
        return wait
