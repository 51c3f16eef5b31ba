"""The official openai SDK's AsyncOpenAI against a live node, on asyncio as its users run it:
forced and required tools, .parse(), streamed logprobs, n=2, embeddings, models.retrieve and a
streamed Responses API call, several requests in flight at once."""

from __future__ import annotations

import asyncio

import openai
import pytest

from clientkit import CITY_QUESTION, MODEL, WEATHER_QUESTION, WEATHER_TOOL, City, WeatherArgs

pytestmark = pytest.mark.live

GREEDY = dict(model=MODEL, temperature=0)


def run(base_url: str, work):
    """``work(client)`` on a fresh asyncio loop with a fresh AsyncOpenAI."""

    async def main():
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as client:
            return await work(client)

    return asyncio.run(main())


def test_async_forced_and_required_tools_concurrently(base_url):
    async def work(client):
        named = {"type": "function", "function": {"name": "get_weather"}}
        return await asyncio.gather(
            *(
                client.chat.completions.create(
                    **GREEDY, messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=64
                )
                for choice in (named, "required")
            )
        )

    named, required = run(base_url, work)
    assert len(named.choices[0].message.tool_calls) == 1  # a named choice is exactly one call
    for r in (named, required):
        calls = r.choices[0].message.tool_calls
        assert calls and r.choices[0].finish_reason == "tool_calls"
        for call in calls:
            assert call.function.name == "get_weather"
            WeatherArgs.model_validate_json(call.function.arguments)


def test_async_parse(base_url):
    r = run(
        base_url,
        lambda c: c.chat.completions.parse(**GREEDY, messages=CITY_QUESTION, response_format=City, max_tokens=96),
    )
    assert isinstance(r.choices[0].message.parsed, City), r.choices[0].message.content


def test_async_streamed_logprobs_and_n(base_url):
    async def work(client):
        stream = await client.chat.completions.create(
            **GREEDY,
            messages=[{"role": "user", "content": "Hi!"}],
            max_tokens=8,
            logprobs=True,
            top_logprobs=2,
            n=2,
            stream=True,
        )
        texts, tokens = {0: "", 1: ""}, {0: "", 1: ""}
        async for chunk in stream:
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
                for e in (c.logprobs.content or ()) if c.logprobs else ():
                    assert len(e.top_logprobs) == 2
                    tokens[c.index] += e.token
        return texts, tokens

    texts, tokens = run(base_url, work)
    assert texts[0] and texts[1] and texts == tokens


def test_async_embeddings_and_model(base_url):
    async def work(client):
        return await asyncio.gather(
            client.embeddings.create(model=MODEL, input=["one", "two"]), client.models.retrieve(MODEL)
        )

    emb, model = run(base_url, work)
    assert [d.index for d in emb.data] == [0, 1] and len(emb.data[0].embedding) == len(emb.data[1].embedding) > 0
    assert model.id == MODEL


def test_async_responses_stream(base_url):
    async def work(client):
        async with client.responses.stream(model=MODEL, input="Say hello.", temperature=0, max_output_tokens=16) as s:
            deltas = [e.delta async for e in s if e.type == "response.output_text.delta"]
            return deltas, await s.get_final_response()

    deltas, final = run(base_url, work)
    assert deltas and final.output_text == "".join(deltas) and final.status in ("completed", "incomplete")
