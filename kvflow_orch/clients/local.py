"""LLM client for the embedded engine running in this process (``backend="local"``).

Hints go straight onto the :class:`~backends.base.GenerateRequest` and steps updates straight into
``engine.apply_steps`` (the engine contract says it never blocks on model work), so nothing is
serialised. The fixed/dynamic boundary is exact: ``encode_chat(messages, fixed_messages=1)``.

Ownership: an engine built here from a model name or an ``EngineConfig`` is started and shut down
by this client; an engine object passed in belongs to the caller, who starts and stops it.
"""

from __future__ import annotations

import logging
from typing import Any

from ..protocol import Sampling
from ..protocol import KVFlowHint, StepsUpdate
from .base import BackendError, LLMClient, LLMReply, Messages

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
        from backends.base import EngineError, GenerateRequest

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
