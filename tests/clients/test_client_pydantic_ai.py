"""pydantic-ai against a live node: an Agent whose one tool the model calls (forced on the first
step through per-step model settings, text afterwards), and Agents with a structured
``output_type`` (its default tool output, and ``NativeOutput``: ``response_format`` json_schema)."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic_ai import Agent, NativeOutput, RunContext
from pydantic_ai.messages import ToolCallPart, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai_compatible import OpenAICompatibleProvider
from pydantic_ai.settings import ModelSettings

from clientkit import MODEL, City, WeatherArgs, weather_result

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def model(base_url):
    provider = OpenAICompatibleProvider("hydra", base_url=base_url, api_key="x")
    return OpenAIChatModel(MODEL, provider=provider, settings=ModelSettings(temperature=0, max_tokens=96))


def test_agent_calls_its_tool(model):
    def settings(ctx: RunContext) -> ModelSettings:
        # the first request must call the tool; after its result, the answer is text
        return ModelSettings(tool_choice=["get_weather"] if ctx.run_step <= 1 else "none")

    agent = Agent(model, model_settings=settings, instructions="Use the tools to answer.")
    calls: list[WeatherArgs] = []

    @agent.tool_plain
    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
        """The current weather in a city."""
        calls.append(WeatherArgs(city=city[:40], unit=unit))
        return weather_result(city, unit)

    result = agent.run_sync("What is the weather in Paris?")
    assert calls  # one, or several in parallel: each ran with arguments that validate
    parts = [p for m in result.all_messages() for p in m.parts]
    assert [p.tool_name for p in parts if isinstance(p, ToolCallPart)] == ["get_weather"] * len(calls)
    assert [p.tool_name for p in parts if isinstance(p, ToolReturnPart)] == ["get_weather"] * len(calls)
    assert isinstance(result.output, str) and result.output


def test_agent_structured_output_type(model):
    result = Agent(model, output_type=City).run_sync("Describe the city of Paris.")
    assert isinstance(result.output, City)


def test_agent_native_structured_output(model):
    result = Agent(model, output_type=NativeOutput(City)).run_sync("Describe the city of Paris as JSON.")
    assert isinstance(result.output, City)
