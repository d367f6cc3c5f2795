"""The calls a benchmark sent to vLLM, as brain calls, and the trace-replay bounds on them.

vLLM's scheduler keeps no record the brain's replay could read, so the benchmark records on the
client side: :class:`RecordingClient` is the kvflow runtime's own HTTP client, keeping every chat
call (messages, reply cap, hint, vLLM's usage) and every steps update in the order the runtime
sent them. :func:`brain_events` turns them into the events an engine would have driven the brain
with (tokenized with the model's own chat template; vLLM's prompt token counts are checked against
it): a real :class:`~backends.kvcache.KVCache` takes each call through ``accept``, ``reserve`` and
``release`` under a :class:`~backends.kvcache.trace.BrainRecorder`, one call at a time in sending
order. :func:`bounds` replays those events (:func:`backends.kvcache.trace.replay`).

vLLM caches in whole blocks, which the brain's token-granular replay does not follow, so its bounds
are no bound for vLLM's hit tokens. :func:`block_requests` gives the same calls as
:class:`backends.kvcache.block_replay.Request` (prompt ids, reply tokens, the hinted fixed prefix,
and when each call was sent and answered, so concurrent calls overlap as they did) for the
block-granular replay (:func:`backends.kvcache.block_replay.block_bounds`).

Concurrent calls are taken one at a time in the order they were sent: the replay follows
sequential traces, so for concurrent workflows the bounds are those of the serialized requests
(each running alone, with the whole pool beside it), looser than any order can reach when several
requests hold blocks at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from backends.kvcache import CacheConfig, KVCache
from backends.kvcache.block_replay import Request
from backends.kvcache.intake import AgentRequest
from backends.kvcache.lifecycle import Refused
from backends.kvcache.trace import BrainRecorder, replay
from kvflow_orch.clients.base import LLMReply
from kvflow_orch.clients.http import HttpClient
from kvflow_orch.harness.demo import EngineRun, replay_bounds
from kvflow_orch.protocol import KVFlowHint, Sampling, StepsUpdate

__all__ = ["RecordedCall", "RecordingClient", "brain_events", "block_requests", "bounds"]

# placeholder ids for generated tokens: no prompt holds them, so no later call can hit them
_OUTPUT_ID_BASE = 1 << 40


@dataclass
class RecordedCall:
    messages: list[dict[str, Any]]
    max_tokens: int
    hint: KVFlowHint | None
    reply: LLMReply | None = None
    sent: int = 0
    """Position among the client's sends and replies (with ``answered``): the calls' overlap."""
    answered: int | None = None


class RecordingClient(HttpClient):
    """The runtime's HTTP client, keeping ``log``: :class:`RecordedCall` and ``StepsUpdate`` items
    in sending order."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.log: list[RecordedCall | StepsUpdate] = []
        self._moments = 0

    def _moment(self) -> int:
        self._moments += 1
        return self._moments

    async def chat(self, messages: Any, sampling: Sampling, hint: KVFlowHint | None) -> LLMReply:
        call = RecordedCall([dict(m) for m in messages], sampling.max_tokens, hint, sent=self._moment())
        self.log.append(call)
        call.reply = await super().chat(messages, sampling, hint)
        call.answered = self._moment()
        return call.reply

    def send_steps(self, update: StepsUpdate) -> None:
        self.log.append(update)
        super().send_steps(update)


def _ids(tokenizer: Any, messages: list[dict[str, Any]], generation: bool) -> list[int]:
    return list(tokenizer.encode(tokenizer.render_chat(messages, add_generation_prompt=generation)))


def _prompt(n: int, item: RecordedCall, tokenizer: Any) -> tuple[list[int], int | None]:
    """Call ``n``'s prompt ids and hinted fixed-prefix tokens; ValueError when the prompt does not
    tokenize to the length vLLM reported."""
    assert item.reply is not None, "a recorded call without its reply"
    prompt = _ids(tokenizer, item.messages, True)
    if len(prompt) != item.reply.prompt_tokens:
        raise ValueError(f"call {n}: the chat template gives {len(prompt)} prompt tokens, vLLM counted "
                         f"{item.reply.prompt_tokens}: the trace would not be the same requests")
    fixed = None
    if item.hint is not None and item.hint.fixed_prefix is not None:  # as the vLLM plugin's API server counts it
        head = item.messages[: item.hint.fixed_prefix]
        fixed = len(_ids(tokenizer, head, False)) if head else 0
    return prompt, fixed


def block_requests(log: list[RecordedCall | StepsUpdate], tokenizer: Any) -> list[Request]:
    """The recorded calls as block-replay requests, in sending order, stamped with when they were
    sent and answered. Raises ValueError as :func:`brain_events`."""
    calls = [item for item in log if isinstance(item, RecordedCall)]
    out = []
    for n, item in enumerate(calls):
        prompt, fixed = _prompt(n, item, tokenizer)
        out.append(Request(prompt, item.reply.completion_tokens, fixed, item.sent, item.answered))
    return out


def brain_events(log: list[RecordedCall | StepsUpdate], tokenizer: Any, config: CacheConfig) -> list:
    """The brain calls an engine with ``config`` makes for ``log`` (one call at a time). Raises
    ValueError when a prompt does not tokenize to the length vLLM reported."""
    cache = KVCache(replace(config, prefetch=False), clock=lambda: 0.0)
    recorder = BrainRecorder(cache)
    for n, item in enumerate(log):
        if isinstance(item, StepsUpdate):
            cache.apply_steps(item)
            continue
        prompt, fixed = _prompt(n, item, tokenizer)
        decision = cache.accept(AgentRequest(prompt, item.hint, fixed))
        out = item.reply.completion_tokens
        reservation = cache.reserve(prompt, out + 1)
        if isinstance(reservation, Refused):
            raise ValueError(f"call {n}: {len(prompt)} prompt tokens do not fit a {config.device_tokens}-token pool")
        generated = [_OUTPUT_ID_BASE + n * 4096 + i for i in range(out)]
        cache.release(reservation, prompt + generated, decision)
    return recorder.events


def bounds(events: list, config: CacheConfig) -> dict[str, int]:
    """Prompt tokens hit (out of ``prompt``) on the recorded requests: stock LRU and kvflow's order
    replayed through the brain, the best online order (kvflow's order, exact steps-to-execution,
    the namespace cap lifted: on a workflow with a fixed order the steps are the future, known
    online), Bélády (the offline optimum) and the floor's hits (a pool that holds everything)."""
    prompt = sum(len(payload.prompt) for kind, payload in events if kind == "request")

    def hits(cfg: CacheConfig) -> int:
        return prompt - replay(events, cfg).stats.recomputed_tokens

    shared = replay_bounds(EngineRun(None, {}, 0.0, tuple(events), config))
    assert shared is not None
    return {"prompt": prompt, "lru": hits(replace(config, policy="lru")), "kvflow": prompt - shared.replayed,
            "best_online": hits(replace(config, namespace_cap_tokens=config.device_tokens)),
            "belady": prompt - shared.belady, "all_cached": prompt - shared.floor}
