"""LangChain structured output and tools against the real embedded server (tiny-random engine): every
``with_structured_output`` method returns a valid object, a ``create_react_agent`` gets a tool call
and runs its tool, and a streamed tool call reassembles to the call a plain request returns."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from server_helpers import start_server

langchain_openai = pytest.importorskip("langchain_openai")


class Ticket(BaseModel):
    """A support ticket."""

    title: str = Field(max_length=40)
    priority: Literal["low", "high"]
    estimate_days: int
    tags: list[str]


@pytest.fixture(scope="module")
def served():
    with start_server() as s:
        yield s


def chat_model(served, model: str = "tiny-random", **kwargs):
    return langchain_openai.ChatOpenAI(model=model, base_url=served.url + "/v1", api_key="unused",
                                       temperature=0, max_retries=0, timeout=120, **kwargs)


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_with_structured_output_returns_a_valid_object(served, method):
    structured = chat_model(served).with_structured_output(Ticket, method=method)
    ticket = structured.invoke("File a ticket: the login page is slow.")
    assert isinstance(ticket, Ticket)
    Ticket.model_validate(ticket.model_dump())


def test_with_structured_output_json_mode_returns_json(served):
    # json_mode sends no schema (as on OpenAI): the reply is a JSON object, its fields are the model's
    schema = {"title": "Anything", "type": "object", "properties": {}}
    result = chat_model(served).with_structured_output(schema, method="json_mode").invoke("Reply in JSON.")
    assert isinstance(result, dict)


def test_with_structured_output_include_raw_has_the_tool_call(served):
    model = chat_model(served).with_structured_output(Ticket, method="function_calling", include_raw=True)
    out = model.invoke("Ticket: crash on save")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Ticket)
    (call,) = out["raw"].tool_calls
    assert call["name"] == "Ticket" and call["id"].startswith("call_")
    assert out["raw"].response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_react_agent_gets_tool_calls_and_runs_its_tool(served):
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    ran: list[dict] = []

    @tool(return_direct=True)
    def lookup_weather(city: str) -> str:
        """Current weather in a city."""
        ran.append({"city": city})
        return f"sunny in {city}"

    # tool_choice="required": a random model would otherwise be free to answer in text; return_direct
    # ends the run after the tool instead of asking the model (which must call again) forever.
    model = chat_model(served).bind_tools([lookup_weather], tool_choice="required")
    agent = create_react_agent(model, [lookup_weather])
    result = agent.invoke({"messages": [("user", "What is the weather in Paris?")]})
    calls = [c for m in result["messages"] for c in getattr(m, "tool_calls", [])]
    assert [c["name"] for c in calls] == ["lookup_weather"]
    assert ran and isinstance(ran[0]["city"], str)
    assert result["messages"][-1].type == "tool" and result["messages"][-1].content.startswith("sunny in ")


def test_streamed_tool_call_reassembles_to_the_same_call(served):
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = chat_model(served).bind_tools([add], tool_choice="add")
    whole = model.invoke("What is 2 + 3?")
    chunks = list(model.stream("What is 2 + 3?"))
    assert len(chunks) > 2  # really streamed, not one message
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]
    assert whole.tool_calls[0]["name"] == "add" and set(whole.tool_calls[0]["args"]) == {"a", "b"}
    assert merged.response_metadata["finish_reason"] == "tool_calls"
    (chunk,) = merged.tool_call_chunks
    assert json.loads(chunk["args"]) == whole.tool_calls[0]["args"] and chunk["id"].startswith("call_")
