"""Anthropic Messages API: the pure parts (body -> request, shapes, stream events, model mapping)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from hydra_node.anthropic.routes import generation_request
from hydra_node.anthropic.format import (
    MessageEventStream,
    error_body,
    error_response,
    matched_stop,
    message_body,
    stop_reason,
)
from hydra_node.anthropic.models import largest_model, parameter_count, resolve_model
from hydra_node.anthropic.request import parse_count_tokens_body, parse_messages_body
from hydra_node.http.guard import key_matches
from hydra_node.api.errors import ApiError
from hydra_node.api.tool_choice_header import TOOL_CHOICE_HEADER, override_tool_choice
from hydra_node.grammar.toolcalls import ParsedToolCall, ToolCallStart

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def body(**kw) -> bytes:
    base = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    base.update(kw)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def refused(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_messages_body(raw)
    assert info.value.status == 400
    return info.value


def test_a_tool_conversation_becomes_chat_messages():
    call = parse_messages_body(
        body(
            system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "is_error": True,
                            "content": [{"type": "text", "text": "again"}],
                        },
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
        )
    )
    roles = [(m.role, m.content) for m in call.messages]
    assert roles == [
        ("system", "Be brief."),
        ("user", "Weather in Paris?"),
        ("assistant", "Checking."),
        ("tool", "sunny"),
        ("tool", "Error: again"),
        ("user", "Thanks"),
    ]
    assert call.messages[2].tool_calls[0].arguments == '{"city":"Paris"}'
    assert call.messages[3].tool_call_id == "toolu_1" and call.messages[3].name == "get_weather"
    assert call.tools[0].name == "get_weather" and json.loads(call.tools[0].parameters)["required"] == ["city"]


@pytest.mark.parametrize(
    "choice, expect",
    [
        ({"type": "auto"}, ("auto", "", True)),
        ({"type": "any"}, ("required", "", True)),
        (
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            ("function", "get_weather", False),
        ),
        ({"type": "none"}, ("none", "", True)),
    ],
)
def test_tool_choice_maps_to_the_chat_vocabulary(choice, expect):
    call = parse_messages_body(body(tools=[WEATHER], tool_choice=choice))
    assert (call.tool_choice, call.tool_name, call.parallel_tool_calls) == expect
    req = generation_request(call, "msg_1")
    assert bool(req.grammar) == (expect[0] != "none")
    assert bool(req.grammar_triggers) == (expect[0] == "auto")


def test_sampling_and_stops_reach_the_request():
    call = parse_messages_body(
        body(temperature=0, top_p=0.5, stop_sequences=["\n\n", "END"], metadata={"user_id": "u1"}, stream=True)
    )
    req = generation_request(call, "msg_1")
    assert (req.temperature, req.top_p, req.stop, req.max_tokens, req.session) == (0.0, 0.5, ("\n\n", "END"), 16, "u1")
    assert req.logprobs and call.stream  # entries tell which stop ended the answer


def test_top_k_reaches_the_request():
    assert generation_request(parse_messages_body(body(top_k=5)), "msg_1").top_k == 5
    assert generation_request(parse_messages_body(body()), "msg_1").top_k is None


PREFILL = [{"role": "user", "content": "The capital of France?"}, {"role": "assistant", "content": "It is"}]


def test_a_final_text_assistant_message_is_continued():
    """Anthropic's prefill: the host continues the final assistant text (docs/reasoning.md)."""
    req = generation_request(parse_messages_body(body(messages=PREFILL)), "msg_1")
    assert (req.messages[-1].role, req.messages[-1].content) == ("assistant", "It is")


def test_prefill_is_refused_with_tool_use_or_with_thinking():
    tool_use = [
        PREFILL[0],
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
    ]
    assert refused(body(messages=tool_use, tools=[WEATHER])).param == "messages[1]"
    thinking = {"type": "enabled", "budget_tokens": 1024}
    assert refused(body(messages=PREFILL, max_tokens=2048, thinking=thinking)).param == "thinking"


@pytest.mark.parametrize(
    "raw, param",
    [
        (body(max_tokens=...), "max_tokens"),
        (body(max_tokens=0), "max_tokens"),
        (body(model=...), "model"),
        (body(messages=[]), "messages"),
        (body(top_k=0), "top_k"),
        (body(top_k=1.5), "top_k"),
        (body(temperature=1.5), "temperature"),
        (body(stop_sequences=["a", "b", "c", "d", "e"]), "stop_sequences"),
        (body(thinking={"type": "enabled", "budget_tokens": 1023}), "thinking.budget_tokens"),
        (body(thinking={"type": "enabled"}), "thinking.budget_tokens"),
        (body(thinking={"type": "enabled", "budget_tokens": 2048}, max_tokens=2048), "max_tokens"),
        (body(thinking={"type": "enabled", "budget_tokens": 1024, "display": "full"}), "thinking.display"),
        (body(thinking={"type": "sometimes"}), "thinking"),
        (
            body(
                thinking={"type": "enabled", "budget_tokens": 1024},
                max_tokens=4096,
                tools=[WEATHER],
                tool_choice={"type": "any"},
            ),
            "tool_choice",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "t", "signature": ""}]}]),
            "messages[0].content[0].type",
        ),
        (body(foo=1), "foo"),
        (body(metadata={"other": 1}), "metadata"),
        (body(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
        (
            body(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            "messages[0].content[0].source.type",  # tests/anthropic/test_anthropic_images.py
        ),
        (body(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]), "messages[1]"),
        (body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
        (body(tools=[{"name": "x"}]), "tools[0].input_schema"),
        (body(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), "tool_choice.name"),
        (body(tool_choice={"type": "any"}), "tool_choice"),
        (body(system=[{"type": "image"}]), "system[0].type"),
        (b"[1]", None),
        (b"{not json", None),
    ],
)
def test_refusals_name_the_field(raw, param):
    assert refused(raw).param == param


def test_count_tokens_body_needs_no_max_tokens_and_refuses_generation_fields():
    call = parse_count_tokens_body(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "s"}).encode()
    )
    assert [m.role for m in call.messages] == ["system", "user"]
    with pytest.raises(ApiError) as info:
        parse_count_tokens_body(body())
    assert info.value.param == "max_tokens"


def test_error_shapes_are_anthropics():
    assert error_body(404, "no") == {"type": "error", "error": {"type": "not_found_error", "message": "no"}}
    assert error_body(502, "x")["error"]["type"] == "api_error"
    resp = error_response(ApiError(429, "slow down", "rate_limited", retry_after=2.2))
    assert resp.status == 429 and ("retry-after", "3") in resp.headers
    assert json.loads(resp.body)["error"] == {"type": "rate_limit_error", "message": "slow down"}


def test_stop_reasons():
    assert stop_reason("tool_calls", None) == "tool_use"
    assert stop_reason("length", None) == "max_tokens"
    assert stop_reason("stop", "END") == "stop_sequence"
    assert stop_reason("stop", None) == "end_turn"
    assert matched_stop("abc END x\n\n", ("\n\n", "END")) == "END"
    assert matched_stop("abc", ("\n\n", "END")) is None
    assert matched_stop("xEND", ("END", "ND")) == "END"  # first by position, then by order


def test_message_body_with_text_and_a_call():
    call = ParsedToolCall(0, "call_abc", "get_weather", '{"city":"Paris"}')
    out = message_body("msg_1", "m", "Sure.", [call], "tool_use", None, {"input_tokens": 3, "output_tokens": 4})
    assert out["content"] == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert out["type"] == "message" and out["role"] == "assistant" and out["stop_reason"] == "tool_use"


def test_stream_events_open_and_close_blocks_in_order():
    s = MessageEventStream("msg_1", "m")
    evs = s.start() + s.text_delta("Hi") + s.text_delta(" there")
    evs += s.call_start(ToolCallStart(0, "call_1", "get_weather"))
    evs += s.call_arguments('{"city":') + s.call_arguments('"Paris"}')
    evs += s.tool_call(ParsedToolCall(0, "call_1", "get_weather", '{"city":"Paris"}', streamed=True))
    evs += s.tool_call(ParsedToolCall(1, "call_2", "get_weather", '{"city":"Rome"}'))
    evs += s.finish("tool_use", None, {"input_tokens": 5, "output_tokens": 9})
    kinds = [(e["type"], e.get("index")) for e in evs]
    assert kinds == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert evs[6]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    assert "".join(e["delta"]["partial_json"] for e in evs[7:9]) == '{"city":"Paris"}'
    assert evs[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_x_api_key_or_bearer():
    assert key_matches({"x-api-key": "k"}, "k") and key_matches({"authorization": "Bearer k"}, "k")
    assert not key_matches({"x-api-key": "no"}, "k") and not key_matches({}, "k")
    assert key_matches({}, None)


def test_model_mapping():
    ids = ["SmolLM2-135M-Instruct-Q4_1", "Qwen2.5-1.5B-Instruct", "tiny"]
    assert parameter_count("Qwen2.5-1.5B-Instruct") == 1.5e9 and parameter_count("Mixtral-8x7B") == 56e9
    assert largest_model(ids) == "Qwen2.5-1.5B-Instruct"
    assert largest_model(ids, {"tiny": 10**12}) == "tiny"
    assert resolve_model("claude-sonnet-4-5", ids) == "Qwen2.5-1.5B-Instruct"
    assert resolve_model("claude-sonnet-4-5", ids, mapped="tiny") == "tiny"
    assert resolve_model("tiny", ids) == "tiny" and resolve_model("gpt-4", ids) == "gpt-4"


@given(st.lists(st.sampled_from(["a-7B", "b-135M", "c", "d-1.5B", "e-7B"]), min_size=1))
def test_largest_model_ignores_order(ids):
    assert largest_model(ids) == largest_model(list(reversed(ids)))


def test_what_claude_code_sends_is_accepted():
    """Claude Code's body: adaptive thinking, clearing thinking, an effort, a system message inside
    the conversation, a deferred tool, metadata.user_id as JSON text."""
    call = parse_messages_body(
        body(
            thinking={"type": "adaptive", "display": "omitted"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            output_config={"effort": "high"},
            metadata={"user_id": '{"session_id": "s1"}'},
            max_tokens=32000,
            tools=[WEATHER, {**WEATHER, "name": "later", "defer_loading": True}],
            cache_control={"type": "ephemeral"},
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
            ],
        )
    )
    assert [(m.role, m.content) for m in call.messages] == [("user", "hi"), ("system", "# Environment")]
    assert [t.name for t in call.tools] == ["get_weather"]  # the deferred tool is not loaded
    assert call.session == '{"session_id": "s1"}'


@pytest.mark.parametrize(
    "field, value",
    [
        ("context_management", {"edits": [{"type": "clear_tool_uses_20250919"}]}),
        ("output_config", {"format": {"type": "json_schema"}}),
        ("output_config", {"effort": "extreme"}),
        ("thinking", {"type": "adaptive", "budget_tokens": 5}),
        ("context_management", {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "turns"}}]}),
    ],
)
def test_fields_that_would_change_the_answer_are_refused(field, value):
    assert refused(body(**{field: value})).param.split(".")[0] == field


@pytest.mark.parametrize(
    "header, dialect, expect",
    [
        ("any", "messages", {"type": "any"}),
        ("required", "messages", {"type": "any"}),
        ("tool:get_weather", "messages", {"type": "tool", "name": "get_weather"}),
        ("none", "messages", {"type": "none"}),
        ("required", "chat", "required"),
        ("any", "chat", "required"),
        ("tool:get_weather", "chat", {"type": "function", "function": {"name": "get_weather"}}),
    ],
)
def test_the_tool_choice_header_replaces_the_bodys(header, dialect, expect):
    raw = body(tools=[WEATHER], tool_choice={"type": "auto"})
    assert json.loads(override_tool_choice(raw, header, dialect))["tool_choice"] == expect
    untouched = body()
    assert override_tool_choice(untouched, header, dialect) == untouched  # no tools: nothing to choose
    assert override_tool_choice(raw, None, dialect) == raw
    with pytest.raises(ApiError) as info:
        override_tool_choice(raw, "sometimes", dialect)
    assert info.value.status == 400 and info.value.param == TOOL_CHOICE_HEADER
