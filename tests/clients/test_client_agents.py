"""openai-agents with its default Responses API against a live node: an Agent with one function
tool and ``tool_choice="required"`` runs to completion with ``Runner.run_sync``, having called it.
Tracing is off (no network)."""

from __future__ import annotations

from typing import Literal

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem

from clientkit import MODEL, WeatherArgs, weather_result

pytestmark = pytest.mark.live


@pytest.fixture(scope="module", autouse=True)
def default_client(base_url):
    set_tracing_disabled(True)
    set_default_openai_api("responses")  # the SDK's default, said out loud
    set_default_openai_client(
        openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120), use_for_tracing=False
    )


def make_agent(calls: list, **behaviour) -> Agent:
    @function_tool
    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
        """The current weather in a city."""
        calls.append(WeatherArgs(city=city[:40], unit=unit))
        return weather_result(city, unit)

    return Agent(
        name="weather",
        instructions="Answer with the get_weather tool.",
        model=MODEL,
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64),
        **behaviour,
    )


def test_agent_calls_its_tool_and_stops_on_it():
    calls: list[WeatherArgs] = []
    result = Runner.run_sync(
        make_agent(calls, tool_use_behavior="stop_on_first_tool"), "What is the weather in Paris?", max_turns=3
    )
    assert calls and result.final_output == weather_result(calls[0].city, calls[0].unit)
    kinds = [type(i) for i in result.new_items]
    assert kinds == [ToolCallItem] * len(calls) + [ToolCallOutputItem] * len(calls), result.new_items


def test_agent_answers_after_its_tool():
    """The default behaviour: the tool's output goes back (``previous_response_id`` or the input items),
    tool_choice resets, and the model answers in text."""
    calls: list[WeatherArgs] = []
    result = Runner.run_sync(make_agent(calls), "What is the weather in Paris?", max_turns=4)
    assert len(calls) >= 1
    assert isinstance(result.final_output, str) and result.final_output
