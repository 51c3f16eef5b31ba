"""The official openai SDK (sync) against a live node: tools, .parse(), logprobs, n, embeddings,
models.retrieve and the Responses API. Assertions are on structure, not on the small model's
meaning: the named tool is called with arguments that validate, JSON validates, shapes match."""

from __future__ import annotations

import json
import math

import openai
import pytest

from clientkit import (
    CITY_QUESTION,
    MODEL,
    TIME_TOOL,
    WEATHER_PARAMETERS,
    WEATHER_QUESTION,
    WEATHER_TOOL,
    City,
    WeatherArgs,
    weather_result,
)

pytestmark = pytest.mark.live

GREEDY = dict(model=MODEL, temperature=0)


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def only_call(message, name: str):
    """The message's single tool call (a named ``tool_choice`` means exactly one call, as OpenAI
    documents it), checked: named ``name``, an id, no call markup left in the content."""
    assert message.tool_calls and len(message.tool_calls) == 1, message
    call = message.tool_calls[0]
    assert call.type == "function" and call.id and call.function.name == name
    assert "<tool_call>" not in (message.content or "")
    return call


# ---- tools -----------------------------------------------------------------------------------


def test_named_tool_choice_forces_that_call(client):
    r = client.chat.completions.create(
        **GREEDY,
        messages=WEATHER_QUESTION,
        tools=[TIME_TOOL, WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
    )
    choice = r.choices[0]
    call = only_call(choice.message, "get_weather")
    WeatherArgs.model_validate_json(call.function.arguments)
    assert choice.finish_reason == "tool_calls"


def test_required_tool_choice_without_parallel_calls_makes_one_valid_call(client):
    r = client.chat.completions.create(
        **GREEDY,
        messages=WEATHER_QUESTION,
        tools=[TIME_TOOL, WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
    )
    msg = r.choices[0].message
    assert msg.tool_calls and len(msg.tool_calls) == 1 and r.choices[0].finish_reason == "tool_calls"
    call = msg.tool_calls[0]
    if call.function.name == "get_time":  # the model may pick either tool
        assert isinstance(json.loads(call.function.arguments)["zone"], str)
    else:
        WeatherArgs.model_validate_json(only_call(msg, "get_weather").function.arguments)


def test_auto_tool_choice_answers_with_text_or_a_valid_call(client):
    r = client.chat.completions.create(
        **GREEDY, messages=WEATHER_QUESTION, tools=[TIME_TOOL, WEATHER_TOOL], tool_choice="auto", max_tokens=64
    )
    msg, finish = r.choices[0].message, r.choices[0].finish_reason
    if msg.tool_calls:
        assert finish == "tool_calls"
        for call in msg.tool_calls:
            assert call.function.name in ("get_weather", "get_time")
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert finish in ("stop", "length") and msg.content


def test_tool_result_in_history_then_no_tool(client):
    """An assistant's call and the tool's result are rendered into the prompt; ``none`` answers in text."""
    history = WEATHER_QUESTION + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": weather_result("Paris", "celsius")},
    ]
    r = client.chat.completions.create(
        **GREEDY, messages=history, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=24
    )
    assert not r.choices[0].message.tool_calls
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")


def test_streamed_forced_call_accumulates_into_valid_arguments(client):
    """``delta.tool_calls`` fragments as OpenAI streams them: the SDK's stream helper rebuilds and parses them."""
    tool = openai.pydantic_function_tool(WeatherArgs, name="get_weather", description="The current weather.")
    with client.chat.completions.stream(
        **GREEDY,
        messages=WEATHER_QUESTION,
        tools=[tool],
        max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ) as s:
        kinds = {event.type for event in s}
        final = s.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds and "tool_calls.function.arguments.done" in kinds
    call = only_call(final.choices[0].message, "get_weather")
    assert isinstance(call.function.parsed_arguments, WeatherArgs)
    assert final.choices[0].finish_reason == "tool_calls"


# ---- structured output -----------------------------------------------------------------------


def test_parse_with_a_pydantic_model(client):
    r = client.chat.completions.parse(**GREEDY, messages=CITY_QUESTION, response_format=City, max_tokens=96)
    msg = r.choices[0].message
    assert isinstance(msg.parsed, City), msg.content
    assert r.choices[0].finish_reason == "stop"


# ---- logprobs and n --------------------------------------------------------------------------


def check_logprobs(entries, text: str, top: int) -> None:
    """OpenAI's shape: the tokens spell the text; each has its top alternatives, best first, and,
    greedy, the chosen token is the best one."""
    assert entries and "".join(e.token for e in entries) == text
    for e in entries:
        assert e.logprob <= 0 and math.isfinite(e.logprob)
        assert e.bytes is None or (e.bytes and all(0 <= b < 256 for b in e.bytes))
        assert len(e.top_logprobs) == top
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert e.top_logprobs[0].token == e.token and math.isclose(lps[0], e.logprob, abs_tol=1e-4)


def test_logprobs_with_top_logprobs(client):
    r = client.chat.completions.create(
        **GREEDY, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, logprobs=True, top_logprobs=2
    )
    check_logprobs(r.choices[0].logprobs.content, r.choices[0].message.content, 2)
    assert len(r.choices[0].logprobs.content) <= r.usage.completion_tokens


def test_streamed_logprobs_match_the_streamed_text(client):
    chunks = list(
        client.chat.completions.create(
            **GREEDY,
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=12,
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or ()]
    check_logprobs(entries, text, 2)


def test_n_2_gives_two_indexed_choices(client):
    kw = dict(GREEDY, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8)
    r = client.chat.completions.create(**kw, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content for c in r.choices)
    assert r.usage.completion_tokens >= 2
    # not compared with each other: a prompt prefix shared from the cache changes llama.cpp's batch
    # split and so the last bits of greedy logits (see tests/node/test_openai_api.py)


def test_n_2_streams_both_choices(client):
    kw = dict(GREEDY, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8)
    texts = {0: "", 1: ""}
    for chunk in client.chat.completions.create(**kw, n=2, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] and texts[1]


# ---- embeddings and models -------------------------------------------------------------------


def test_embeddings_float_and_base64(client):
    texts = ["The cat sat on the mat.", "Stock prices fell sharply.", "The cat sat on the mat."]
    r = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 and decodes it
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens > 0
    vecs = [d.embedding for d in r.data]
    assert len(vecs[0]) > 0 and all(len(v) == len(vecs[0]) for v in vecs)
    assert vecs[0] == pytest.approx(vecs[2], abs=1e-4) and vecs[0] != pytest.approx(vecs[1], abs=1e-3)
    f = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert f.data[0].embedding == pytest.approx(vecs[0], abs=1e-4)


def test_embeddings_refuse_dimensions_naming_it(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=MODEL, input="hello", dimensions=8)
    assert exc.value.body["param"] == "dimensions"


def test_models_retrieve(client):
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


# ---- Responses API ---------------------------------------------------------------------------

RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": WEATHER_PARAMETERS,
    "strict": True,
}


def test_responses_text(client):
    r = client.responses.create(
        model=MODEL, instructions="Answer briefly.", input="Say hello.", temperature=0, max_output_tokens=16
    )
    assert r.status in ("completed", "incomplete") and r.object == "response"
    assert r.output and r.output[0].type == "message" and r.output_text
    assert r.usage.output_tokens > 0


def test_responses_stream_events_through_completed(client):
    events = list(
        client.responses.create(model=MODEL, input="Say hello.", temperature=0, max_output_tokens=16, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text
    assert [e.sequence_number for e in events] == sorted(e.sequence_number for e in events)


def test_responses_function_call_then_its_output(client):
    r = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[RESPONSES_TOOL],
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    args = WeatherArgs.model_validate_json(calls[0].arguments)
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=r.id,
        tools=[RESPONSES_TOOL],
        temperature=0,
        max_output_tokens=24,
        input=[
            {
                "type": "function_call_output",
                "call_id": calls[0].call_id,
                "output": weather_result(args.city, args.unit),
            }
        ],
        tool_choice="none",
    )
    assert follow.output_text and follow.previous_response_id == r.id
