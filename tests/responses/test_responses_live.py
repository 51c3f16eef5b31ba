"""/v1/responses on a live node with the real bundled model, driven by the official openai client
(and the OpenAI Agents SDK, which calls /v1/responses by default)."""

from __future__ import annotations

import json

import openai
import pytest
from harness import request
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def node(shared_node):
    """The session's shared node (tests/conftest.py): prompt cache off, as stream and whole are compared."""
    return shared_node


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.base_url, api_key="unused", max_retries=0, timeout=120)


def test_text_response_and_its_stream_agree(client):
    kw = dict(
        model=MODEL,
        instructions="Answer in one short sentence.",
        input="Name a colour.",
        max_output_tokens=16,
        temperature=0,
    )
    whole = client.responses.create(**kw)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.status in ("completed", "incomplete") and whole.output_text
    assert whole.output[0].type == "message" and whole.output[0].role == "assistant"
    assert whole.usage.output_tokens <= 16 and whole.usage.input_tokens > 0
    assert whole.instructions == kw["instructions"] and whole.temperature == 0

    events = list(client.responses.create(**kw, stream=True))
    adapter = TypeAdapter(ResponseStreamEvent)
    for i, ev in enumerate(events):
        adapter.validate_python(ev.model_dump())
        assert ev.sequence_number == i
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-1] == "response.completed" and events[-1].response.status == whole.status
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text


def test_max_output_tokens_makes_it_incomplete(client):
    r = client.responses.create(
        model=MODEL, input="Count from one to one hundred in words.", max_output_tokens=3, temperature=0
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model=MODEL, input="My name is Ada. Say hi.", max_output_tokens=8, temperature=0)
    second = client.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=8, temperature=0
    )
    assert second.previous_response_id == first.id
    # the second prompt holds the first exchange: its input, its answer, and the new question
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(second.id).output_text == second.output_text

    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_unknown")
    assert info.value.code == "previous_response_not_found"
    unstored = client.responses.create(model=MODEL, input="hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="x", previous_response_id=unstored.id)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_function_call_output_round_trip(client):
    r = client.responses.create(
        model=MODEL,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_output_tokens=24,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 24 degrees Celsius."},
        ],
    )
    assert r.status in ("completed", "incomplete") and r.output_text
    assert all(o.type == "message" for o in r.output)
    # the call and its output are part of the prompt
    bare = client.responses.create(
        model=MODEL,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_output_tokens=24,
        input="What is the weather in Paris?",
    )
    assert r.usage.input_tokens > bare.usage.input_tokens


def test_forced_function_call(client):
    r = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        parallel_tool_calls=False,
        max_output_tokens=80,
    )
    assert [o.type for o in r.output] == ["function_call"]  # a forced call: no prose around it
    calls = r.output
    assert calls[0].name == "get_weather" and calls[0].call_id and calls[0].id.startswith("fc_")
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    # answering the call continues from the stored response
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=r.id,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=16,
        temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny."}],
    )
    assert follow.output_text

    stream = list(
        client.responses.create(
            model=MODEL,
            input="Weather in Rome?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_output_tokens=80,
            stream=True,
        )
    )
    done = [e for e in stream if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and "city" in json.loads(done[0].arguments)
    final = stream[-1]
    assert final.type == "response.completed" and final.response.output[-1].type == "function_call"


def test_json_schema_text_format(client):
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model=MODEL,
        input="Pick a colour.",
        temperature=0,
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
    )
    assert isinstance(json.loads(r.output_text)["colour"], str)


def test_logprobs(client):
    r = client.responses.create(
        model=MODEL,
        input="Say hello.",
        max_output_tokens=5,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    lps = r.output[0].content[0].logprobs
    assert lps and len(lps) <= r.usage.output_tokens and r.top_logprobs == 2
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in lps)
    assert "".join(e.token for e in lps).startswith(r.output_text[:1])
    events = list(
        client.responses.create(
            model=MODEL,
            input="Say hello.",
            max_output_tokens=5,
            temperature=0,
            include=["message.output_text.logprobs"],
            top_logprobs=2,
            stream=True,
        )
    )
    streamed = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert streamed == [e.token for e in lps][: len(streamed)] and streamed


def test_refusals_over_http(node):
    code, body = request(
        "POST", node.api_port, "/v1/responses", {"model": MODEL, "input": "x", "reasoning": {"effort": "high"}}
    )
    err = json.loads(body)["error"]
    assert code == 400 and err["param"] == "reasoning.effort" and MODEL in err["message"]  # not a reasoning model
    code, body = request(
        "POST", node.api_port, "/v1/responses", {"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}
    )
    assert code == 400 and json.loads(body)["error"]["param"] == "tools[0].type"
    code, body = request("POST", node.api_port, "/v1/responses", {"model": "nope", "input": "x"})
    assert code == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    code, _ = request("GET", node.api_port, "/v1/responses")
    assert code == 405
    code, body = request(
        "POST",
        node.api_port,
        "/v1/responses",
        {"model": MODEL, "input": "Count to ten.", "stream": True, "max_output_tokens": 1},
    )
    assert code == 200
    frames = [f for f in body.split("\n\n") if f]
    assert frames[0].startswith("event: response.created\ndata: ")
    last = json.loads(frames[-1].split("data: ", 1)[1])
    assert last["type"] == "response.completed" and last["response"]["status"] == "incomplete"
    Response.model_validate(last["response"])


def test_an_agent_calls_a_tool(node):
    """The Agents SDK's default model (Responses API): a forced tool call, then the answer."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool

    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return "Sunny, 24 degrees Celsius."

    model = OpenAIResponsesModel(MODEL, openai.AsyncOpenAI(base_url=node.base_url, api_key="unused", max_retries=0))
    agent = Agent(
        name="weather",
        instructions="Use the tool to answer.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=48),
    )
    result = Runner.run_sync(
        agent, "What is the weather in Paris?", max_turns=4, run_config=RunConfig(tracing_disabled=True)
    )
    kinds = [type(i).__name__ for i in result.new_items]
    assert calls and isinstance(result.final_output, str)
    assert kinds.index("ToolCallItem") < kinds.index("ToolCallOutputItem") < len(kinds) - 1
    assert kinds[-1] == "MessageOutputItem"


def test_a_streamed_agent_with_an_output_type(node):
    """Streaming through the Agents SDK, with a JSON output type (text.format json_schema)."""
    import asyncio

    from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        summary: str

    async def run():
        model = OpenAIResponsesModel(MODEL, openai.AsyncOpenAI(base_url=node.base_url, api_key="unused", max_retries=0))
        agent = Agent(
            name="weather",
            instructions="Report the weather.",
            model=model,
            output_type=Weather,
            model_settings=ModelSettings(temperature=0, max_tokens=64),
        )
        result = Runner.run_streamed(
            agent,
            "It is sunny in Paris. What is the weather?",
            max_turns=2,
            run_config=RunConfig(tracing_disabled=True),
        )
        raw = [ev.data.type async for ev in result.stream_events() if ev.type == "raw_response_event"]
        return result, raw

    result, raw = asyncio.run(run())
    assert raw[0] == "response.created" and raw[-1] == "response.completed"
    assert "response.output_text.delta" in raw
    assert isinstance(result.final_output, Weather)


def test_a_forced_call_streams_its_arguments_and_the_sdk_rebuilds_it(client):
    kw = dict(
        model=MODEL,
        input="What is the weather in Rome?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=80,
    )
    events = list(client.responses.create(**kw, stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) > 1 and "".join(deltas) == done.arguments  # fragments as they were generated
    with pytest.raises(ValueError):
        json.loads(deltas[0])  # the first was sent before the arguments were complete
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.arguments == "" and added.item.name == "get_weather"
    assert events.index(added) < min(i for i, e in enumerate(events) if e.type.endswith("arguments.delta"))
    assert events[-1].response.output[-1].arguments == done.arguments
    with client.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    assert final.status == "completed"


def test_a_call_cut_by_max_output_tokens_is_incomplete_streamed_or_not(client):
    kw = dict(
        model=MODEL,
        input="What is the weather in Rome?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    )
    n = client.responses.create(**kw, max_output_tokens=80).usage.output_tokens
    cut_inside = 0
    # Four cut points (each a whole and a streamed grammar-constrained call). The call's text ends in
    # about 8 closing tokens after the arguments: n - 11 and n - 9 cut inside them, n - 5 and n - 2 in
    # the closing text; at least one must cut inside the arguments.
    for max_tokens in sorted({max(1, n - 11), max(1, n - 9), max(1, n - 5), max(1, n - 2)}):
        whole = client.responses.create(**kw, max_output_tokens=max_tokens)
        events = list(client.responses.create(**kw, max_output_tokens=max_tokens, stream=True))
        final = events[-1].response
        for r in (whole, final):
            calls = [o for o in r.output if o.type == "function_call"]
            if not calls:  # cut before the name was complete: the text generated, as a message
                assert r.status == "incomplete" and r.output_text.startswith("<tool_call>")
                continue
            (call,) = calls
            assert not r.output_text  # the call's text never comes again as a message
            try:
                json.loads(call.arguments)
            except ValueError:
                assert call.status == "incomplete" and r.status == "incomplete"
                cut_inside += 1
            else:
                assert call.status == "completed"
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert deltas == "".join(o.arguments for o in final.output if o.type == "function_call")
    assert cut_inside
