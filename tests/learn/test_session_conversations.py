"""Learned hints rank a session's own conversation: the learner names a session's agents per session,
and the real brain, fed only those hints, keeps a session's growing conversation under pressure.

Plain agent traffic reuses mostly a session's own conversation (each call of an agent extends its
previous call in that session). With app-wide agent names the intake's boundary rule compared a
call with the agent's previous call, another session's when sessions interleave: only the system
prompt was tagged, and the conversation went first under pressure, where LRU kept it.
"""

from __future__ import annotations

from typing import Any

from backends.kvcache import AgentRequest, CacheConfig, KVCache
from backends.kvcache.lifecycle import Refused
from backends.learn import TrafficLearner, session_agent

WORKER = "You are a Research Worker. Answer with one fact per call and keep going until done."
HELPER = "You are a Title Helper. Give the report a title."


def render(messages: list[dict[str, Any]]) -> tuple[int, ...]:
    """A toy host tokenizer: one token per character of a role-tagged rendering."""
    return tuple(ord(c) for m in messages for c in f"<{m['role']}>{m['content']}")


def serve(cache: KVCache, learner: TrafficLearner, messages: list[dict[str, Any]], reply: str) -> tuple[int, Any]:
    """One request as a host with the learner runs it: learned hint -> intake -> reserve -> release.
    Returns the cached prompt tokens it reused and its learned record."""
    learned = learner.observe({"model": "m", "messages": messages})
    hint = learned.hint
    fixed = None if hint is None or hint.fixed_prefix is None else len(render(messages[:hint.fixed_prefix]))
    prompt = render(messages)
    decision = cache.accept(AgentRequest(prompt, hint, fixed))
    answer = tuple(ord(c) for c in reply)
    reservation = cache.reserve(prompt, len(answer))
    assert not isinstance(reservation, Refused)
    cache.release(reservation, prompt + answer[:-1], decision)
    learner.reply(learned, {"content": reply})
    return reservation.reused, learned


def test_learned_hints_name_a_sessions_agents_per_session_and_declare_the_system_prompt() -> None:
    learner = TrafficLearner()
    messages = [{"role": "system", "content": WORKER}, {"role": "user", "content": "tides"}]
    learned = learner.observe({"model": "m", "messages": messages})
    sid = learned.session_id
    assert learned.agent == "research-worker" and learned.hint.agent == session_agent("research-worker", sid)
    assert learned.hint.workflow_id == sid and set(learned.hint.steps) == {session_agent("research-worker", sid)}
    assert learned.hint.fixed_prefix == 1  # the leading system message: its first call tags it already
    assert learner.observe({"model": "m", "prompt": "raw text"}, route="completions").hint.fixed_prefix is None


def test_a_sessions_growing_conversation_survives_pressure_from_another_agent() -> None:
    # two users' sessions of one ReAct worker, interleaved; then a one-off helper needs room.
    # The pool holds both conversations but not the helper's prompt as well: something must go.
    cache = KVCache(CacheConfig(device_tokens=600, host_tokens=0))
    learner = TrafficLearner()
    convs = {s: [{"role": "system", "content": WORKER}, {"role": "user", "content": f"Facts on {s}, please."}]
             for s in ("tides", "winds")}
    sessions = {}
    for turn in range(3):
        for s, conv in convs.items():
            reply = f"Fact {turn} on {s}: a long enough sentence about {s} to matter here."
            _, learned = serve(cache, learner, conv, reply)
            sessions.setdefault(s, learned.session_id)
            assert learned.session_id == sessions[s]  # linked by content, no session key
            conv += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Next."}]
    # each call tagged the session's previous prompt (all it shares with it) as that session's agent
    for s, conv in convs.items():
        ref = ("learned", session_agent("research-worker", sessions[s]))
        assert cache.intake.prefixes.tokens(ref) >= len(render(conv[:4])), s
    helper = [{"role": "system", "content": HELPER},
              {"role": "user", "content": "Title for a report on the sea, winds and tides, in a few words " * 2}]
    serve(cache, learner, helper, "Sea, winds and tides")
    assert cache.stats.evicted_device_tokens > 0  # the helper's prompt forced eviction
    # each session's next call finds that conversation still cached (LRU would have kept it too)
    for s, conv in convs.items():
        reused, _ = serve(cache, learner, conv, "Done.")
        assert reused >= len(render(conv[:4])), s
