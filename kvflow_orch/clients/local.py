"""LLM client for the embedded engine running in this process (``backend="local"``).

Hints go straight onto the :class:`~backends.base.GenerateRequest` and steps updates straight into
``engine.apply_steps`` (the engine contract says it never blocks on model work), so nothing is
serialised. The fixed/dynamic boundary is exact: ``encode_chat(messages, fixed_messages=1)``.

Ownership: an engine built here from a model name or an ``EngineConfig`` is started and shut down
by this client; an engine object passed in belongs to the caller, who starts and stops it.

Registered as the ``local`` backend: ``"local"``, ``"local:MODEL"``, an ``EngineConfig`` or a
started engine object.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from backends.base import EngineError, GenerateRequest

from ..protocol import KVFlowHint, Sampling, StepsUpdate
from .base import BackendError, LLMClient, LLMReply, Messages
from .registry import register_backend

__all__ = ["LocalClient", "DEFAULT_MODEL"]

log = logging.getLogger("kvflow.runtime")

DEFAULT_MODEL = "smollm2-135m"


class LocalClient(LLMClient):
    def __init__(self, engine: Any = None, *, config: Any = None, model: str | None = None) -> None:
        """Give an ``engine`` (a started ServingEngine you own), or a ``config``/``model`` to build one."""
        self._owned = engine is None
        if engine is None:
            from backends.local import Engine, EngineConfig  # torch is imported only here

            engine = Engine(config if config is not None else EngineConfig(model=model or DEFAULT_MODEL))
        self.engine = engine
        self.name = f"local:{getattr(engine, 'model_name', model or DEFAULT_MODEL)}"
        self._started = not self._owned

    @property
    def supports_hints(self) -> bool:
        return True

    async def _ensure_started(self) -> None:
        if not self._started:
            await self.engine.start()
            self._started = True

    async def chat(self, messages: Messages, sampling: Sampling, hint: KVFlowHint | None) -> LLMReply:
        try:
            await self._ensure_started()
            encoded = self.engine.tokenizer.encode_chat(list(messages), fixed_messages=1)
            request = GenerateRequest(
                input_ids=tuple(encoded.input_ids),
                sampling=sampling,  # the engine contract's SamplingParams is this very class
                hint=hint,
                fixed_prefix_tokens=encoded.fixed_prefix_tokens,
            )
            result = await self.engine.generate(request)
        except (EngineError, ValueError) as exc:
            raise BackendError(self.name, f"{type(exc).__name__}: {exc}") from exc
        return LLMReply(
            result.text,
            result.prompt_tokens,
            len(result.output_ids),
            result.cached_tokens,
            encoded.fixed_prefix_tokens,
        )

    def send_steps(self, update: StepsUpdate) -> None:
        try:
            self.engine.apply_steps(update)
        except Exception as exc:  # a lost hint costs cache efficiency, never the workflow
            log.warning("steps update for workflow %r rejected by %s: %s", update.workflow_id, self.name, exc)

    async def flush(self, timeout: float = 5.0) -> None:
        return None

    async def aclose(self) -> None:
        if self._owned and self._started:
            self._started = False
            await self.engine.shutdown()


def _is_engine(backend: Any) -> bool:
    """A started engine object (``backends.base.ServingEngine``) or an embedded engine's config."""
    if hasattr(backend, "generate") and hasattr(backend, "apply_steps") and hasattr(backend, "tokenizer"):
        return True
    # An EngineConfig exists only once backends.local is imported: checking this way leaves torch
    # unloaded for any other object.
    local = sys.modules.get("backends.local")
    return local is not None and isinstance(backend, local.EngineConfig)


def _open(backend: Any) -> LocalClient:
    if isinstance(backend, str):
        return LocalClient(model=backend.partition(":")[2] or DEFAULT_MODEL)
    if hasattr(backend, "generate"):
        return LocalClient(backend)  # the client is ours, the engine the caller's
    return LocalClient(config=backend)


register_backend("local", _open, accepts=_is_engine)
