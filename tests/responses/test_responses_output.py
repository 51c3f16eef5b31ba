"""/v1/responses output (pure): response objects, the typed event sequence, the bounded store.

Every object is validated with the installed openai package's own models."""

from __future__ import annotations

import itertools
import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from hydra_node.responses.output import conversation_after, output_items, response_body, usage_body
from hydra_node.responses.request import parse_responses_body
from hydra_node.responses.store import ResponsesStore
from hydra_node.responses.stream import ResponseEventStream, sse
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.inference import ChatMessage, TokenLogprob, ToolCall

EVENTS = TypeAdapter(ResponseStreamEvent)
TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add",
    "strict": True,
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
}
USAGE = {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37, "prompt_tokens_details": {"cached_tokens": 4}}


def call_of(**body):
    return parse_responses_body(json.dumps({"model": "m", "input": "hi", **body}).encode(), lambda _id: None)


def counter():
    n = itertools.count()
    return lambda _nbytes: f"{next(n):04d}"


def test_text_answer_is_a_completed_message():
    call = call_of(instructions="Be brief.", metadata={"k": "v"}, tools=[TOOL])
    output = output_items("Hello!", [], "stop", counter())
    body = response_body(call, "resp_1", 1700000000, status="completed", output=output, usage=usage_body(USAGE))
    r = Response.model_validate(body)
    assert r.output_text == "Hello!" and r.status == "completed" and r.id == "resp_1"
    assert r.output[0].id == "msg_0000" and r.output[0].content[0].annotations == []
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (30, 7, 37)
    assert r.usage.input_tokens_details.cached_tokens == 4 and r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == "Be brief." and r.metadata == {"k": "v"} and r.tools[0].name == "add"
    assert r.tool_choice == "auto" and r.parallel_tool_calls is True and r.text.format.type == "text"


def test_calls_become_function_call_items_after_any_text():
    calls = [ParsedToolCall(0, "call_a", "add", '{"a":1}'), ParsedToolCall(1, "call_b", "add", '{"a":2}')]
    output = output_items(None, calls, "tool_calls", counter())
    assert [o["type"] for o in output] == ["function_call", "function_call"]
    r = Response.model_validate(
        response_body(call_of(tools=[TOOL]), "resp_1", 1, status="completed", output=output, usage=usage_body(USAGE))
    )
    assert [(o.id, o.call_id, o.name, o.arguments) for o in r.output] == [
        ("fc_0000", "call_a", "add", '{"a":1}'),
        ("fc_0001", "call_b", "add", '{"a":2}'),
    ]
    with_text = output_items("Let me add.", calls[:1], "tool_calls", counter())
    assert [o["type"] for o in with_text] == ["message", "function_call"]


def test_length_makes_an_incomplete_response():
    output = output_items("partial", [], "length", counter())
    body = response_body(
        call_of(max_output_tokens=5),
        "resp_1",
        1,
        status="incomplete",
        output=output,
        usage=usage_body(USAGE),
        incomplete={"reason": "max_output_tokens"},
    )
    r = Response.model_validate(body)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.max_output_tokens == 5


def test_conversation_after_keeps_history_and_output_but_not_instructions():
    call = call_of(instructions="sys", tools=[TOOL])
    output = output_items("ok", [ParsedToolCall(0, "call_a", "add", '{"a":1}')], "tool_calls", counter())
    assert conversation_after(call, output) == (
        ChatMessage("user", "hi"),
        ChatMessage("assistant", "ok", (ToolCall("call_a", "add", '{"a":1}'),)),
    )


def _validated(events: list[dict]) -> list[str]:
    for i, ev in enumerate(events):
        EVENTS.validate_python(ev)
        assert ev["sequence_number"] == i
        raw = sse(ev)
        assert raw.startswith(f"event: {ev['type']}\ndata: ".encode()) and raw.endswith(b"\n\n")
        assert json.loads(raw.split(b"data: ", 1)[1]) == ev
    return [ev["type"] for ev in events]


def test_stream_of_text_then_a_call():
    s = ResponseEventStream(call_of(tools=[TOOL]), "resp_1", 1, counter())
    events = s.start() + s.text("Hel") + s.text("lo") + s.text("")
    events += s.tool_call(ParsedToolCall(0, "call_a", "add", '{"a":1}'))
    events += s.finish("tool_calls", USAGE)
    assert _validated(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[6]["text"] == "Hello" and events[4]["item_id"] == events[8]["item"]["id"] == "msg_0000"
    assert events[10]["delta"] == '{"a":1}' and events[10]["output_index"] == 1
    assert events[11]["name"] == "add" and events[11]["arguments"] == '{"a":1}'  # the SDK's event.name
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "Hello" and final.output[1].call_id == "call_a" and final.usage.output_tokens == 7
    assert s.done and s.final == events[-1]["response"] and s.finish("stop", USAGE) == []


def test_stream_with_nothing_generated_still_has_one_message():
    s = ResponseEventStream(call_of(), "resp_1", 1, counter())
    types = _validated(s.start() + s.finish("stop", USAGE))
    assert types[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_stream_cut_by_max_output_tokens_is_incomplete():
    s = ResponseEventStream(call_of(max_output_tokens=3), "resp_1", 1, counter())
    events = s.start() + s.text("a b c") + s.finish("length", USAGE)
    assert _validated(events)[-1] == "response.completed"  # OpenAI: response.incomplete (docs/responses.md)
    assert events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete"


@pytest.mark.parametrize("status, code", [(503, "server_error"), (429, "rate_limit_exceeded")])
def test_stream_failure_is_response_failed(status, code):
    s = ResponseEventStream(call_of(), "resp_1", 1, counter())
    events = s.start() + s.text("par") + s.fail("the peer went away", status)
    assert _validated(events)[-1] == "response.failed"
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error.code == code and failed.error.message == "the peer went away"
    assert s.done and s.fail("again") == [] and s.text("more") == []


def test_store_evicts_least_recently_used_by_count():
    store = ResponsesStore(max_responses=2)
    conv = (ChatMessage("user", "x"),)
    for rid in ("a", "b"):
        store.put(rid, conv)
    assert store.get("a") == conv  # a is now the most recently used
    store.put("c", conv)
    assert store.get("b") is None and store.get("a") == conv and store.get("c") == conv
    assert len(store) == 2 and store.evicted == 1


def test_store_is_bounded_by_bytes():
    store = ResponsesStore(max_responses=100, max_bytes=200)
    big = (ChatMessage("user", "x" * 120),)
    assert store.put("a", big)
    assert store.put("b", big)
    assert store.get("a") is None and store.get("b") == big and store.bytes <= 200
    assert not store.put("huge", (ChatMessage("user", "x" * 500),)) and store.get("huge") is None
    assert store.pop("b") and store.bytes == 0 and len(store) == 0


def test_whitespace_before_a_call_is_not_a_message():
    call = ParsedToolCall(0, "call_a", "add", '{"a":1}')
    assert [o["type"] for o in output_items("\n ", [call], "tool_calls", counter())] == ["function_call"]
    s = ResponseEventStream(call_of(tools=[TOOL]), "resp_1", 1, counter())
    events = s.start() + s.text("\n") + s.text(" ") + s.tool_call(call) + s.finish("tool_calls", USAGE)
    types = _validated(events)
    assert "response.content_part.added" not in types
    assert [o["type"] for o in events[-1]["response"]["output"]] == ["function_call"]
    # held whitespace is kept when text follows it, or when nothing else came
    s = ResponseEventStream(call_of(), "resp_2", 1, counter())
    events = s.start() + s.text("\n") + s.text("Hi") + s.finish("stop", USAGE)
    assert Response.model_validate(events[-1]["response"]).output_text == "\nHi"
    s = ResponseEventStream(call_of(), "resp_3", 1, counter())
    events = s.start() + s.text("\n") + s.finish("stop", USAGE)
    assert (
        _validated(events)[-1] == "response.completed"
        and events[-1]["response"]["output"][0]["content"][0]["text"] == "\n"
    )


LP = [
    TokenLogprob("Hel", -0.5, b"Hel", (("Hel", -0.5, b"Hel"), ("Hi", -1.5, b"Hi"))),
    TokenLogprob("lo", -0.25, b"lo", (("lo", -0.25, b"lo"), ("p", -2.0, b"p"))),
]
LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}


def test_logprobs_in_the_message_when_asked_for():
    output = output_items("Hello", [], "stop", counter(), logprobs=LP)
    r = Response.model_validate(
        response_body(call_of(**LOGPROBS), "resp_1", 1, status="completed", output=output, usage=usage_body(USAGE))
    )
    lps = r.output[0].content[0].logprobs
    assert [(e.token, e.logprob, e.bytes) for e in lps] == [("Hel", -0.5, list(b"Hel")), ("lo", -0.25, list(b"lo"))]
    assert [(t.token, t.logprob) for t in lps[0].top_logprobs] == [("Hel", -0.5), ("Hi", -1.5)]
    assert r.top_logprobs == 2
    # not asked for: [] (the schema requires the field on every output_text part)
    assert output_items("Hello", [], "stop", counter())[0]["content"][0]["logprobs"] == []


def test_logprobs_in_the_stream():
    s = ResponseEventStream(call_of(**LOGPROBS), "resp_1", 1, counter())
    events = s.start() + s.text("", LP[:1]) + s.text("Hello", LP[1:]) + s.finish("stop", USAGE)
    _validated(events)
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert [e["token"] for e in delta["logprobs"]] == ["Hel", "lo"]  # the early entry rides on the next text
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert [e["top_logprobs"][1]["token"] for e in done["logprobs"]] == ["Hi", "p"]
    final = Response.model_validate(events[-1]["response"])
    assert [e.token for e in final.output[0].content[0].logprobs] == ["Hel", "lo"]
    # not asked for: none anywhere ([] where the schema requires the field)
    s = ResponseEventStream(call_of(), "resp_2", 1, counter())
    events = s.start() + s.text("Hello", LP) + s.finish("stop", USAGE)
    assert all(not e.get("logprobs") for e in events)
    assert events[-1]["response"]["output"][0]["content"][0]["logprobs"] == []


def test_stream_of_a_streamed_call_sends_each_fragment():
    from hydra_node.grammar.toolcalls import ToolCallStart

    s = ResponseEventStream(call_of(tools=[TOOL]), "resp_1", 1, counter())
    events = s.start() + s.text("\n") + s.call_start(ToolCallStart(0, "call_a", "add"))
    events += s.call_arguments('{"a"') + s.call_arguments("") + s.call_arguments(": 1}")
    events += s.tool_call(ParsedToolCall(0, "call_a", "add", '{"a":1}', streamed=True))
    events += s.finish("tool_calls", USAGE)
    assert _validated(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["item"]["arguments"] == "" and events[2]["item"]["status"] == "in_progress"
    assert [e["delta"] for e in events[3:5]] == ['{"a"', ": 1}"] and events[5]["arguments"] == '{"a": 1}'
    assert events[6]["item"]["arguments"] == '{"a": 1}' and events[6]["item"]["status"] == "completed"
    final = Response.model_validate(events[-1]["response"])
    assert [(o.type, o.call_id, o.arguments) for o in final.output] == [("function_call", "call_a", '{"a": 1}')]


def test_stream_of_a_call_cut_by_max_output_tokens():
    from hydra_node.grammar.toolcalls import ToolCallStart

    s = ResponseEventStream(call_of(tools=[TOOL], max_output_tokens=9), "resp_1", 1, counter())
    events = s.start() + s.text("Sure.") + s.call_start(ToolCallStart(0, "call_a", "add")) + s.call_arguments('{"a')
    events += s.tool_call(ParsedToolCall(0, "call_a", "add", '{"a', streamed=True, complete=False))
    events += s.finish("length", USAGE)
    types = _validated(events)
    assert types.count("response.output_item.done") == 2 and types[-1] == "response.completed"
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "incomplete" and [o.type for o in final.output] == ["message", "function_call"]
    assert final.output[1].status == "incomplete" and final.output[1].arguments == '{"a'
    assert final.output_text == "Sure."
