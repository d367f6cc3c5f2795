"""LangChain structured output and tools on SmolLM2-135M behind the real server (slow: loads the
model): every ``with_structured_output`` method returns a valid object, and an ``auto`` react agent
on a real model decides by itself to call its tool, with the right argument. (SmolLM2-135M then keeps
calling it instead of answering: stopping on time needs a bigger model.)"""

from __future__ import annotations

import time

import pytest
from pydantic import BaseModel, Field

from server_helpers import start_server

langchain_openai = pytest.importorskip("langchain_openai")


class Capital(BaseModel):
    """The capital city of a country."""

    country: str = Field(max_length=40)
    capital: str = Field(max_length=40)


@pytest.fixture(scope="module")
def model():
    with start_server(model="smollm2-135m", device_tokens=4096, host_tokens=8192) as served:
        yield langchain_openai.ChatOpenAI(model="smollm2-135m", base_url=served.url + "/v1", api_key="unused",
                                          temperature=0, max_retries=0, timeout=300, max_tokens=96)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_smollm2_structured_output(model, method):
    started = time.perf_counter()
    structured = model.with_structured_output(Capital if method != "json_mode" else None, method=method)
    out = structured.invoke("What is the capital of France? Answer in JSON with keys country and capital.")
    if method == "json_mode":
        assert isinstance(out, dict)
    else:
        assert isinstance(out, Capital)
    print(f"{method}: {out!r} in {time.perf_counter() - started:.1f} s")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_smollm2_react_agent_with_auto_tool_choice_calls_its_tool(model):
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    ran: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        ran.append(city)
        return f"It is sunny in {city}."

    agent = create_react_agent(model, [get_weather])
    result = agent.invoke({"messages": [("user", "What is the weather in Paris? Use the tool.")]},
                          {"recursion_limit": 8})
    first_call = next(m for m in result["messages"] if m.type == "ai").tool_calls[0]
    assert first_call["name"] == "get_weather" and first_call["args"] == {"city": "Paris"}
    assert ran and ran[0] == "Paris"
    print([(m.type, getattr(m, "tool_calls", None) or m.content) for m in result["messages"]])
