"""/v1/responses request parsing (pure): input items -> chat messages, honoured and refused fields."""

from __future__ import annotations

import json

import pytest
from agents import AgentOutputSchema, ModelSettings, function_tool
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI, Omit
from pydantic import BaseModel

from hydra_node.api.errors import ApiError
from hydra_node.responses.items import input_messages
from hydra_node.responses.request import DEFAULT_TEMPERATURE, parse_responses_body
from hydra_node.inference import ChatMessage, ToolCall

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


def parse(body: dict, previous=lambda _id: None):
    return parse_responses_body(json.dumps({"model": "m", **body}).encode(), previous)


def refused(body: dict, previous=lambda _id: None) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body, previous)
    assert info.value.status == 400
    return info.value


def test_string_input_is_one_user_message_after_the_instructions():
    call = parse({"input": "hello", "instructions": "Be brief."})
    assert call.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "hello"))
    assert call.history == (ChatMessage("user", "hello"),)
    assert call.temperature == DEFAULT_TEMPERATURE and not call.stream and call.store


def test_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "rules"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "let me look", "annotations": [], "logprobs": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": "{\"city\":\"Paris\"}",
            "status": "completed",
        },
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
    ]
    assert input_messages(items) == [
        ChatMessage("system", "rules"),
        ChatMessage("user", "ab"),
        ChatMessage(
            "assistant",
            "let me look",
            (
                ToolCall("call_1", "get_weather", "{\"city\":\"Paris\"}"),
                ToolCall("call_2", "get_weather", "{\"city\":\"Rome\"}"),
            ),
        ),
        ChatMessage("tool", "sunny", tool_call_id="call_1", name="get_weather"),
        ChatMessage("tool", "rain", tool_call_id="call_2", name="get_weather"),
    ]


def test_a_function_call_output_is_named_from_the_previous_conversation():
    history = (ChatMessage("user", "x"), ChatMessage("assistant", "", (ToolCall("call_9", "lookup", "{}"),)))
    call = parse(
        {
            "previous_response_id": "resp_1",
            "input": [{"type": "function_call_output", "call_id": "call_9", "output": "found"}],
        },
        previous=lambda rid: history if rid == "resp_1" else None,
    )
    assert call.history == history + (ChatMessage("tool", "found", tool_call_id="call_9", name="lookup"),)
    assert call.previous_response_id == "resp_1"


def test_unknown_previous_response_is_refused():
    err = refused({"input": "x", "previous_response_id": "resp_nope"})
    assert (err.code, err.param) == ("previous_response_not_found", "previous_response_id")


@pytest.mark.parametrize(
    "item, param",
    [
        ({"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}, "input[0].content[0].file_id"),
        ({"role": "tool", "content": "x"}, "input[0].role"),
        ({"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"}, "input[0].encrypted_content"),
        ({"type": "reasoning", "content": [{"type": "reasoning_text", "text": "t"}]}, "input[0].summary"),
        ({"type": "reasoning", "summary": [{"type": "output_text", "text": "t"}]}, "input[0].summary[0].type"),
        ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id"),
        (
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file", "file_id": "f"}]},
            "input[0].output[0].type",
        ),
        ({"role": "user", "content": "x", "audio": "y"}, "input[0].audio"),
        ("just a string", "input[0]"),
    ],
)
def test_unsupported_items_are_refused_naming_them(item, param):
    assert refused({"input": [item]}).param == param


@pytest.mark.parametrize("role", [[], {}, [None], 5, None])
@pytest.mark.parametrize("typed", [False, True])
def test_a_role_that_is_not_a_string_is_refused_naming_it(role, typed):
    item = {"role": role, "content": "x"} | ({"type": "message"} if typed else {})
    err = refused({"input": [{"role": "user", "content": "hi"}, item]})  # not a TypeError (unhashable)
    assert err.param == "input[1].role" and "'input[1].role' must be one of" in err.message


@pytest.mark.parametrize("include", [[[]], [{}], [None]])
def test_an_include_entry_that_is_not_a_string_is_refused(include):
    assert refused({"input": "hi", "include": include}).param == "include"


def test_tools_and_tool_choice():
    call = parse(
        {
            "input": "x",
            "tools": [TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
        }
    )
    assert [t.name for t in call.tools] == ["get_weather"]
    assert json.loads(call.tools[0].parameters) == TOOL["parameters"]
    assert (call.tool_choice, call.tool_name, call.parallel_tool_calls) == ("function", "get_weather", False)
    fields = call.response_fields()
    assert fields["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert fields["tools"] == [TOOL] and fields["parallel_tool_calls"] is False
    assert parse({"input": "x", "tools": [TOOL], "tool_choice": "required"}).tool_choice == "required"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [dict(TOOL, output_schema={"type": "string"})]}, "tools[0].output_schema"),
        ({"tools": [TOOL, TOOL]}, "tools[1].name"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
        ({"reasoning": {"generate_summary": "concise"}}, "reasoning.generate_summary"),
        ({"reasoning": {"effort": 3}}, "reasoning.effort"),
        ({"reasoning": {"effort": "low", "budget": 9}}, "reasoning.budget"),
        ({"reasoning": "high"}, "reasoning"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
        ({"truncation": "auto"}, "truncation"),
        ({"background": True}, "background"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"max_tool_calls": 2}, "max_tool_calls"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"stream_options": {"include_obfuscation": True}}, "stream_options"),
        ({"seed": 3}, "seed"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"text": {"format": {"type": "json_schema", "name": "x y", "schema": {}}}}, "text.format.name"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": "9"}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_what_would_change_the_output_is_refused_naming_it(body, param):
    assert refused({"input": "x", **body}).param == param


def test_neutral_values_are_accepted():
    call = parse(
        {
            "input": "x",
            "include": ["reasoning.encrypted_content"],
            "truncation": "disabled",
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "auto",
            "background": False,
            "store": False,
            "metadata": {"k": "v"},
            "user": "u1",
            "prompt_cache_key": "pk",
            "text": {"format": {"type": "text"}, "verbosity": None},
            "top_logprobs": 0,
        }
    )
    assert not call.store and call.metadata == {"k": "v"} and call.session == "pk"
    assert call.response_fields()["user"] == "u1"


def test_missing_model_and_input():
    with pytest.raises(ApiError) as info:
        parse_responses_body(b'{"input": "x"}', lambda _id: None)
    assert info.value.param == "model"
    assert refused({}).param == "input"
    assert refused({"input": []}).param == "input"
    with pytest.raises(ApiError) as info:
        parse_responses_body(b"{not json", lambda _id: None)
    assert info.value.code == "invalid_json"


def test_json_schema_format_is_kept_for_the_grammar():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    call = parse(
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}}}
    )
    assert call.text_format == {"type": "json_schema", "name": "out", "schema": schema, "strict": True}
    assert call.response_fields()["text"] == {"format": call.text_format}


def _sdk_body(**kw) -> dict:
    """What the OpenAI Agents SDK sends to /v1/responses for an agent (its own request builder)."""
    model = OpenAIResponsesModel("m", AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused"))
    args = dict(
        system_instructions="Be brief.",
        input="What is 2+3?",
        model_settings=ModelSettings(),
        tools=[],
        output_schema=None,
        handoffs=[],
    )
    args.update(kw)
    sent = model._build_response_create_kwargs(**args)
    return {
        k: v
        for k, v in sent.items()
        if not isinstance(v, Omit) and v is not None and k not in ("extra_headers", "extra_query", "extra_body")
    }


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Answer(BaseModel):
    value: int


def test_the_agents_sdk_default_request_is_accepted():
    body = _sdk_body(tools=[add])
    call = parse_responses_body(json.dumps(body).encode(), lambda _id: None)
    assert [t.name for t in call.tools] == ["add"] and call.tool_choice == "auto"
    assert call.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "What is 2+3?"))
    # its follow-up turn: the call it made and the tool's output, as input items
    follow = _sdk_body(
        tools=[add],
        input=[
            {"role": "user", "content": "What is 2+3?"},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "add",
                "arguments": '{"a":2,"b":3}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "5"},
        ],
    )
    call = parse_responses_body(json.dumps(follow).encode(), lambda _id: None)
    assert call.history[-1] == ChatMessage("tool", "5", tool_call_id="call_1", name="add")


def test_the_agents_sdk_structured_output_request_is_accepted():
    body = _sdk_body(output_schema=AgentOutputSchema(Answer))
    call = parse_responses_body(json.dumps(body).encode(), lambda _id: None)
    assert call.text_format["type"] == "json_schema" and call.text_format["name"] == "final_output"


def test_logprobs_are_asked_for_with_include():
    call = parse({"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 2})
    assert (call.logprobs, call.top_logprobs) == (True, 2) and call.response_fields()["top_logprobs"] == 2
    assert not parse({"input": "x"}).logprobs
