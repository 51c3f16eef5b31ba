"""litellm against a live node as an OpenAI-compatible provider (``openai/<id>``): plain chat,
streaming, and a forced tool call. The cost map is the bundled one (LITELLM_LOCAL_MODEL_COST_MAP)."""

from __future__ import annotations

import json

import litellm
import pytest

from clientkit import MODEL, WEATHER_QUESTION, WEATHER_TOOL, WeatherArgs

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def kw(base_url):
    litellm.telemetry = False
    return dict(model=f"openai/{MODEL}", api_base=base_url, api_key="x", temperature=0, num_retries=0, timeout=120)


def test_plain_completion(kw):
    r = litellm.completion(**kw, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12)
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 12


def test_streaming_completion(kw):
    chunks = list(
        litellm.completion(**kw, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_forced_tool_call(kw):
    r = litellm.completion(
        **kw,
        messages=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    WeatherArgs.model_validate(json.loads(calls[0].function.arguments))
