"""The learner's reading of plain requests: agents by fingerprint (dynamic text inside a system
prompt included), readable names, sessions by client key and by content, expiry."""

from __future__ import annotations

import pytest

from backends.learn import LearnerConfig, TrafficLearner


def chat(system: str | None, *turns: tuple[str, str], model: str = "m", tools=None, **extra) -> dict:
    messages = ([{"role": "system", "content": system}] if system is not None else [])
    messages += [{"role": role, "content": text} for role, text in turns]
    body = {"model": model, "messages": messages, **extra}
    if tools is not None:
        body["tools"] = tools
    return body


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


RESEARCHER = "You are a Senior Research Analyst. You dig up facts and cite sources carefully."
WRITER = "You are a Technical Writer. You turn notes into clear prose for engineers."


def test_dynamic_text_in_a_system_prompt_keeps_the_agent() -> None:
    learner = TrafficLearner()
    names = set()
    for day in range(1, 8):
        # digits change, then a trailing clause changes: both are the same agent
        system = f"{RESEARCHER} Today is 2025-05-0{day}, {day + 8}:0{day}. Focus: " + ["tides", "bees", "ore"][day % 3]
        names.add(learner.observe(chat(system, ("user", f"question {day}"))).agent)
    assert names == {"senior-research-analyst"}
    learned = learner.observe(chat(WRITER, ("user", "q"))).agent
    assert learned == "technical-writer"
    stable = {a["name"]: a["stable_chars"] for a in learner.graph()["agents"]}
    assert stable["senior-research-analyst"] < len(RESEARCHER) + 40  # shrunk to what the calls share
    assert stable["senior-research-analyst"] >= len(RESEARCHER)


def test_agents_that_share_boilerplate_stay_apart_and_tools_and_model_count() -> None:
    learner = TrafficLearner()
    tail = " Respond in this exact format: Thought: ... Final Answer: ... " * 3
    a = learner.observe(chat("You are Researcher." + tail, ("user", "x"))).agent
    b = learner.observe(chat("You are Writer." + tail, ("user", "x"))).agent
    assert (a, b) == ("researcher", "writer")
    assert learner.observe(chat("You are Researcher." + tail, ("user", "y"))).agent == "researcher"
    tool = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    with_tools = learner.observe(chat("You are Researcher." + tail, ("user", "x"), tools=tool)).agent
    other_model = learner.observe(chat("You are Researcher." + tail, ("user", "x"), model="m2")).agent
    assert len({a, with_tools, other_model}) == 3
    assert with_tools.startswith("researcher-") and other_model.startswith("researcher-")
    assert learner.observe(chat(None, ("user", "no system prompt at all"))).agent == "agent"


def _tool(name: str, prop: str) -> list[dict]:
    return [{"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {prop: {"type": "string"}}, "required": [prop]}}}]


def test_a_follow_up_call_without_tools_is_the_agent_that_made_the_tool_call() -> None:
    """AutoGen's reflect_on_tool_use: the critic calls its tool, then reads the result in a second
    call of the same system prompt with no tools (the shape recorded in
    benchmarks/results/framework-traffic/autogen.jsonl)."""
    learner = TrafficLearner()
    writer_prompt = "You write one short sentence about the topic you are given."
    critic_prompt = "You check the writer's sentence: count its words with the tool, then say whether it is short."
    writer = learner.observe(chat(writer_prompt, ("user", "Topic 1"))).agent
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "word_count", "arguments": "{}"}}]}
    critic = learner.observe(chat(critic_prompt, ("user", "Topic 1"), tools=_tool("word_count", "text"))).agent
    reflect = chat(critic_prompt, ("user", "Topic 1"))
    reflect["messages"] += [call, {"role": "tool", "tool_call_id": "call_1", "content": "9"}]
    assert learner.observe(reflect).agent == critic  # was a second agent (critic + "-2")
    assert learner.observe(chat(writer_prompt, ("user", "Topic 2"))).agent == writer
    assert {a["name"] for a in learner.graph()["agents"]} == {writer, critic}
    # the same prompt under another model is another agent's
    assert learner.observe(chat(critic_prompt, ("user", "x"), model="m2")).agent != critic


def test_a_call_without_tools_is_nobodys_follow_up_where_it_could_be_two_agents() -> None:
    learner = TrafficLearner()
    shared = "You are an assistant. Use your tool when it helps, then answer in one sentence."
    a = learner.observe(chat(shared, ("user", "q"), tools=_tool("search", "query"))).agent
    b = learner.observe(chat(shared, ("user", "q"), tools=_tool("calculator", "expression"))).agent
    plain = learner.observe(chat(shared, ("user", "q"))).agent
    assert len({a, b, plain}) == 3  # two agents share the prompt: a call without tools cannot say whose
    # an agent first seen with tools, followed, then a second agent with other tools and its lead
    learner = TrafficLearner()
    a = learner.observe(chat(shared, ("user", "q"), tools=_tool("search", "query"))).agent
    assert learner.observe(chat(shared, ("user", "r"))).agent == a
    b = learner.observe(chat(shared, ("user", "q"), tools=_tool("calculator", "expression"))).agent
    assert learner.observe(chat(shared, ("user", "s"))).agent not in (a, b)
    # an agent without tools seen first keeps its calls
    learner = TrafficLearner()
    plain = learner.observe(chat(shared, ("user", "q"))).agent
    tooled = learner.observe(chat(shared, ("user", "q"), tools=_tool("search", "query"))).agent
    assert tooled != plain and learner.observe(chat(shared, ("user", "t"))).agent == plain


def test_sessions_by_client_keys() -> None:
    learner = TrafficLearner()
    sids = {}
    for key_field in ({"prompt_cache_key": "k1"}, {"metadata": {"session_id": "k1"}}, {"user": "k1"},
                      {"safety_identifier": "k1"}, {"metadata": {"thread_id": "t"}}):
        first = learner.observe(chat(RESEARCHER, ("user", "same text"), **key_field))
        second = learner.observe(chat(WRITER, ("user", "other text"), **key_field))
        assert first.session_id == second.session_id
        sids[str(key_field)] = first.session_id
    assert len(set(sids.values())) == len(sids)  # a key's field is part of it
    by_header = [learner.observe(chat(RESEARCHER, ("user", "u")), headers={"x-session-id": "h"}).session_id
                 for _ in range(2)]
    assert by_header[0] == by_header[1]
    # same content, different keys: different sessions (a key is never joined by content)
    a = learner.observe(chat(RESEARCHER, ("user", "task"), user="alice"))
    b = learner.observe(chat(RESEARCHER, ("user", "task"), user="bob"))
    assert a.session_id != b.session_id


def test_sessions_by_content_extension_and_carried_reply() -> None:
    learner = TrafficLearner()
    first = learner.observe(chat(RESEARCHER, ("user", "Plan the migration of the billing service")))
    learner.reply(first, {"content": "Step one: inventory every consumer of the billing API.\nok"})
    other = learner.observe(chat(RESEARCHER, ("user", "An unrelated task about gardening tools")))
    assert other.session_id != first.session_id
    # extends the conversation, reply included
    extended = learner.observe(chat(RESEARCHER, ("user", "Plan the migration of the billing service"),
                                    ("assistant", "Step one: inventory every consumer of the billing API.\nok"),
                                    ("user", "go on")))
    assert extended.session_id == first.session_id
    # another agent gets the earlier reply inside its prompt (CrewAI's context)
    carried = learner.observe(chat(WRITER, ("user", "Write it up. Context:\nStep one: inventory every consumer "
                                                    "of the billing API.\nThanks")))
    assert carried.session_id == first.session_id
    # a tool call id echoed back links too
    tool_req = learner.observe(chat(RESEARCHER, ("user", "Look up the weather for the offsite please")))
    learner.reply(tool_req, {"content": None, "tool_calls": [
        {"id": "call_abc123", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]})
    echoed = learner.observe({"model": "m", "messages": [
        {"role": "system", "content": WRITER}, {"role": "user", "content": "different framing"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc123", "type": "function", "function": {"name": "weather", "arguments": "{ }"}}]},
        {"role": "tool", "tool_call_id": "call_abc123", "content": "sunny"}]})
    assert echoed.session_id == tool_req.session_id


def test_a_reply_two_sessions_both_got_links_by_the_task_they_share() -> None:
    """AutoGen's round robin at small-model scale: two users' writers reply the same sentence, and
    each critic gets its task and that sentence as user messages (the shape recorded in
    benchmarks/results/framework-traffic/autogen.jsonl). The carried line names both sessions; the
    task (the first message) tells them apart, whichever session replied last."""
    learner = TrafficLearner()
    same = "Caching for agents is a game-changer for agent workflows."
    writers = []
    for topic in ("Topic 1: caching for agents.", "Topic 2: caching for agents."):
        writers.append(learner.observe(chat(WRITER, ("user", topic))))
        learner.reply(writers[-1], {"content": same})
    assert writers[0].session_id != writers[1].session_id
    for topic, writer in zip(("Topic 1: caching for agents.", "Topic 2: caching for agents."), writers, strict=True):
        critic = learner.observe(chat(RESEARCHER, ("user", topic), ("user", same)))
        assert critic.session_id == writer.session_id  # was the last replier's for both


def test_sessions_expire_and_are_bounded_and_end_their_workflows() -> None:
    clock = Clock()
    learner = TrafficLearner(LearnerConfig(session_ttl_s=10, max_sessions=3), clock=clock)
    first = learner.observe(chat(RESEARCHER, ("user", "q"), user="a"))
    clock.now = 11
    again = learner.observe(chat(RESEARCHER, ("user", "q"), user="a"))
    assert again.session_id != first.session_id  # expired: a new session
    done = learner.ended()
    assert [(u.workflow_id, u.done) for u in done] == [(first.session_id, True)]
    ended = []
    for i in range(10):  # a host drains ended() after every request, as the server does
        learner.observe(chat(RESEARCHER, ("user", f"q{i}"), user=f"u{i}"))
        ended += [u.workflow_id for u in learner.ended()]
    assert learner.stats()["live_sessions"] == 3
    assert len(ended) == len(set(ended)) == 8  # the bound ended the others, each told once
    assert again.session_id in ended


@pytest.mark.parametrize("bad", [{"user": {"x": 1}}, {"user": [1, 2]}, {"prompt_cache_key": True},
                                 {"metadata": "not a map"}, {"metadata": {"session_id": {"deep": [1]}}},
                                 {"user": "x" * 100_000}])
def test_bad_session_keys_are_never_an_error(bad: dict) -> None:
    learner = TrafficLearner()
    learned = learner.observe(chat(RESEARCHER, ("user", "q"), **bad))
    assert learned.source == "learned" and learned.hint is not None
    wrong_type = not (isinstance(bad.get("user"), str) or bad.get("metadata") == "not a map")
    assert learner.stats()["bad_session_keys"] == int(wrong_type)
