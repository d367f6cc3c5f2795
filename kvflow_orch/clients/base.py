"""The interface between the runtime and an LLM backend.

A client turns one agent call (``[system, user]`` chat messages, sampling parameters and an
optional :class:`~kvflow_orch.protocol.KVFlowHint`) into an :class:`LLMReply`, and forwards
out-of-band :class:`~kvflow_orch.protocol.StepsUpdate`\\ s to the backend.

Invariants every client keeps:

* ``chat`` raises :class:`BackendError` (naming the backend) for anything the backend cannot
  answer properly: unreachable after bounded retries, an HTTP error, a malformed reply.
* ``send_steps`` never blocks and never raises: updates for one workflow are coalesced (only the
  newest pending one is delivered) and a failed delivery is logged, not propagated.
* ``flush`` waits (bounded) until every update queued so far has been attempted; ``aclose``
  flushes, then releases what the client owns.
"""

from __future__ import annotations

import abc
from typing import Any, Mapping, NamedTuple, Sequence

from ..protocol import Sampling
from ..protocol import KVFlowHint, StepsUpdate

__all__ = ["LLMReply", "LLMClient", "BackendError", "Messages"]

Messages = Sequence[Mapping[str, Any]]


class LLMReply(NamedTuple):
    """What one call produced and what it cost, as reported by the backend."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens the backend did not recompute (device hits, host reloads, prefetched)."""
    fixed_tokens: int | None = None
    """Tokens of the fixed (system) prefix, when the backend knows the boundary."""


class BackendError(RuntimeError):
    """The backend failed a call; ``backend`` names it (a URL or ``local:<model>``)."""

    def __init__(self, backend: str, message: str) -> None:
        super().__init__(f"{message} (backend {backend})")
        self.backend = backend


class LLMClient(abc.ABC):
    """One backend, shared by every workflow a runtime call drives."""

    #: a printable name for messages: the base URL or ``local:<model>``
    name: str

    @property
    @abc.abstractmethod
    def supports_hints(self) -> bool:
        """True when the backend understands kvflow hints (known after the first call)."""

    @abc.abstractmethod
    async def chat(self, messages: Messages, sampling: Sampling, hint: KVFlowHint | None) -> LLMReply:
        """Run one chat completion; ``messages[0]`` is the fixed system prompt."""

    @abc.abstractmethod
    def send_steps(self, update: StepsUpdate) -> None:
        """Queue an out-of-band update; coalesced per workflow, never blocking."""

    @abc.abstractmethod
    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until queued updates were attempted (at most ``timeout`` seconds)."""

    async def aclose(self) -> None:
        """Flush pending updates and release what the client owns."""
        await self.flush()
