"""langchain-openai against a live node: ``bind_tools`` with a forced tool returns ``tool_calls``;
``with_structured_output`` gives a validated Pydantic object by its default method and by
``json_schema`` and ``function_calling``; streaming and the Responses API path work."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from clientkit import MODEL, City, WeatherArgs, weather_result

pytestmark = pytest.mark.live


@tool(args_schema=WeatherArgs)
def get_weather(city: str, unit: str) -> str:
    """The current weather in a city."""
    return weather_result(city, unit)


@pytest.fixture(scope="module")
def chat(base_url):
    return ChatOpenAI(
        model=MODEL, base_url=base_url, api_key="x", temperature=0, max_tokens=96, max_retries=0, timeout=120
    )


def check_calls(msg) -> dict:
    """At least one call, every one of ``get_weather`` with arguments that validate, no call markup
    left in the text; the first call."""
    assert msg.tool_calls and not msg.invalid_tool_calls, msg
    for call in msg.tool_calls:
        assert call["name"] == "get_weather" and call["id"]
        WeatherArgs.model_validate(call["args"])
    assert "<tool_call>" not in msg.text
    return msg.tool_calls[0]


def test_bind_tools_with_a_forced_tool_returns_tool_calls(chat):
    msg = chat.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert isinstance(msg, AIMessage)
    call = check_calls(msg)
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    # the call runs, and its result goes back into the conversation
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]
    results = [result] + [get_weather.invoke(c) for c in msg.tool_calls[1:]]
    reply = chat.bind_tools([get_weather], tool_choice="none").invoke(
        [HumanMessage("What is the weather in Paris?"), msg, *results]
    )
    assert isinstance(reply.content, str) and reply.content and not reply.tool_calls


def test_streamed_forced_tool_call_chunks_add_up(chat):
    bound = chat.bind_tools([get_weather], tool_choice="get_weather")
    total = None
    for chunk in bound.stream("What is the weather in Paris?"):
        total = chunk if total is None else total + chunk
    assert total is not None
    check_calls(total)


@pytest.mark.parametrize("method", [None, "json_schema", "function_calling"])
def test_with_structured_output(chat, method):
    kw = {} if method is None else {"method": method}
    structured = chat.with_structured_output(City, include_raw=True, **kw)
    out = structured.invoke("Describe the city of Paris as JSON with name, country and population.")
    assert out["parsing_error"] is None, out["raw"]
    assert isinstance(out["parsed"], City)


def test_responses_api_path(base_url):
    chat = ChatOpenAI(
        model=MODEL,
        base_url=base_url,
        api_key="x",
        temperature=0,
        max_tokens=16,
        max_retries=0,
        timeout=120,
        use_responses_api=True,
    )
    msg = chat.invoke("Say hello.")
    assert isinstance(msg, AIMessage) and msg.text
