"""/v1/responses with a reasoning model (pure, and over a real loopback server with a stand-in router):
``reasoning.effort`` mapped or refused, reasoning output items and their stream events, reasoning
input items, ``output_text.logprobs`` always present, ``name`` on ``function_call_arguments.done``,
and ``GET /v1/responses/{id}`` query parameters (``stream=true`` replays the stored response).

Every object and event is validated with the installed openai package's own models, and the
openai SDK itself reads the stream (``client.responses.stream``)."""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
from contextlib import asynccontextmanager

import openai
import pytest
import trio
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from api_serving import serving
from hydra_node.api.errors import ApiError
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.inference import NO_CAPS, ChatMessage, Finished, ModelCaps, TextDelta, ToolCall
from hydra_node.responses.constraints import generation_request
from hydra_node.responses.output import conversation_after, output_items, response_body, usage_body
from hydra_node.responses.request import parse_responses_body
from hydra_node.responses.routes import ResponsesApi
from hydra_node.responses.stream import ResponseEventStream, stored_events

EVENTS = TypeAdapter(ResponseStreamEvent)
THINKS = ModelCaps("think", thinks=True, switch=True)
TOOL = {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {}}, "strict": True}
USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 7,
    "total_tokens": 37,
    "prompt_tokens_details": {"cached_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 5},
}


def call_of(previous=lambda _id: None, **body):
    return parse_responses_body(json.dumps({"model": "m", "input": "hi", **body}).encode(), previous)


def refused(**body) -> ApiError:
    with pytest.raises(ApiError) as info:
        call_of(**body)
    return info.value


def counter():
    n = itertools.count()
    return lambda _nbytes: f"{next(n):04d}"


def validated(events: list[dict]) -> list[str]:
    for i, ev in enumerate(events):
        EVENTS.validate_python(ev)
        assert ev["sequence_number"] == i
    return [ev["type"] for ev in events]


# ---- request --------------------------------------------------------------------------------


def test_reasoning_effort_is_mapped_for_a_reasoning_model_and_refused_for_others():
    call = call_of(reasoning={"effort": "low", "summary": "auto"})
    assert call.response_fields()["reasoning"] == {"effort": "low", "summary": "auto"}
    req = generation_request(call, "resp_1", caps=THINKS)
    assert (req.thinking, req.thinking_budget, req.reasoning_effort) == (True, 1024, "low")
    off = generation_request(call_of(reasoning={"effort": "none"}), "resp_1", caps=THINKS)
    assert (off.thinking, off.thinking_budget) == (False, None)
    with pytest.raises(ApiError) as info:
        generation_request(call, "resp_1", caps=NO_CAPS)
    assert info.value.status == 400 and info.value.param == "reasoning.effort" and "'m'" in info.value.message
    # "none" asks a model that does not reason for nothing: accepted, as it always was here
    plain = generation_request(call_of(reasoning={"effort": "none"}), "resp_1", caps=NO_CAPS)
    assert (plain.thinking, plain.thinking_budget, plain.reasoning_effort) == (None, None, "")
    with pytest.raises(ApiError) as info:
        generation_request(call_of(reasoning={"effort": "extreme"}), "resp_1", caps=THINKS)
    assert info.value.param == "reasoning.effort"


def test_a_summary_other_than_auto_is_refused_clearly():
    err = refused(reasoning={"effort": "high", "summary": "detailed"})
    assert err.param == "reasoning.summary" and "no reasoning summariser" in err.message


def test_reasoning_input_items_become_the_reasoning_of_the_assistant_turn_after_them():
    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "T1"}]}
    summed = {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "S"}]}
    call = call_of(
        input=[
            {"role": "user", "content": "q1"},
            thought,
            {"role": "assistant", "content": [{"type": "output_text", "text": "a1", "logprobs": []}]},
            {"role": "user", "content": "q2"},
            summed,  # another server's: only a summary
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "3"},
            thought,  # nothing after it: an assistant turn of its own
        ]
    )
    assert call.history == (
        ChatMessage("user", "q1"),
        ChatMessage("assistant", "a1", reasoning="T1"),
        ChatMessage("user", "q2"),
        ChatMessage("assistant", "", (ToolCall("c1", "add", "{}"),), reasoning="S"),
        ChatMessage("tool", "3", tool_call_id="c1", name="add"),
        ChatMessage("assistant", "", reasoning="T1"),
    )
    err = refused(input=[dict(thought, encrypted_content="gAAAA")])
    assert err.param == "input[0].encrypted_content" and "another server" in err.message


# ---- whole responses ------------------------------------------------------------------------


def test_a_reasoning_item_comes_first_and_the_conversation_keeps_the_thoughts():
    call = call_of()
    output = output_items("Paris.", [], "stop", counter(), reasoning="The capital is Paris.")
    r = Response.model_validate(
        response_body(call, "resp_1", 1, status="completed", output=output, usage=usage_body(USAGE))
    )
    assert [o.type for o in r.output] == ["reasoning", "message"]
    item = r.output[0]
    assert item.id == "rs_0000" and item.summary == [] and item.status == "completed"
    assert [(c.type, c.text) for c in item.content] == [("reasoning_text", "The capital is Paris.")]
    assert item.encrypted_content is None  # never any: the thoughts are in plain content
    assert r.output_text == "Paris." and r.usage.output_tokens_details.reasoning_tokens == 5
    assert r.output[1].content[0].logprobs == []  # required by the schema, [] when not asked
    assert conversation_after(call, output)[-1] == ChatMessage("assistant", "Paris.", reasoning="The capital is Paris.")
    cut = output_items("", [], "length", counter(), reasoning="Hmm")
    assert [(o["type"], o["status"]) for o in cut] == [("reasoning", "incomplete"), ("message", "incomplete")]


# ---- streams --------------------------------------------------------------------------------


def test_stream_of_thoughts_then_text_then_a_call():
    s = ResponseEventStream(call_of(tools=[TOOL]), "resp_1", 1, counter())
    events = s.start() + s.reasoning("Let me ") + s.reasoning("think.") + s.text("\n\n") + s.text("Sure.")
    events += s.tool_call(ParsedToolCall(0, "call_a", "add", "{}"))
    events += s.finish("tool_calls", USAGE)
    assert validated(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
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
    assert events[2]["item"]["type"] == "reasoning" and events[2]["item"]["status"] == "in_progress"
    assert {events[i]["item_id"] for i in (3, 4, 5, 6, 7)} == {"rs_0000"}
    assert events[4]["output_index"] == 0 and events[4]["content_index"] == 0 and events[4]["delta"] == "Let me "
    assert events[6]["text"] == "Let me think." and events[8]["item"]["content"][0]["text"] == "Let me think."
    assert events[11]["output_index"] == 1 and events[12]["text"] == "\n\nSure."
    assert events[17]["name"] == "add" and events[17]["arguments"] == "{}"
    final = Response.model_validate(events[-1]["response"])
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.usage.output_tokens_details.reasoning_tokens == 5


def test_a_stream_with_only_thoughts_still_has_its_message():
    s = ResponseEventStream(call_of(max_output_tokens=4), "resp_1", 1, counter())
    events = s.start() + s.reasoning("Hmm, ") + s.finish("length", USAGE)
    types = validated(events)
    assert types[-6:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1]["response"]
    assert [(o["type"], o["status"]) for o in final["output"]] == [
        ("reasoning", "incomplete"),
        ("message", "incomplete"),
    ]


def test_a_stored_response_replays_as_a_valid_stream():
    output = output_items(
        "Sure.", [ParsedToolCall(0, "call_a", "add", '{"a":1}')], "tool_calls", counter(), reasoning="T"
    )
    body = response_body(call_of(tools=[TOOL]), "resp_1", 1, status="completed", output=output, usage=usage_body(USAGE))
    events = stored_events(body)
    types = validated(events)
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert events[-1]["response"] == body and events[0]["response"]["output"] == []
    assert [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"] == ["T"]
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["Sure."]
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert (done["name"], done["arguments"]) == ("add", '{"a":1}')


# ---- over a real server, with a stand-in for the router -----------------------------------------


class ThinkingRouter:
    """A stand-in for the router: model "think" reasons (its host splits thoughts from the answer,
    as TextDelta.reasoning), model "plain" does not. Records every request."""

    def __init__(self):
        self.requests = []

    def models(self):
        return [type("M", (), {"id": m})() for m in ("think", "plain")]

    def recently_seen(self, model: str) -> bool:
        return False

    def capabilities(self, model: str) -> ModelCaps:
        return THINKS if model == "think" else NO_CAPS

    @asynccontextmanager
    async def generate(self, req):
        self.requests.append(req)

        async def events():
            yield TextDelta("", reasoning="Paris is ")
            yield TextDelta("", reasoning="the capital.")
            yield TextDelta("Paris.")
            yield Finished("stop", 9, 6, reasoning_tokens=4)

        yield events()


def _http(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _sse(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]


async def test_the_openai_sdk_reads_a_reasoning_stream_and_a_stored_one_replayed():
    router = ThinkingRouter()
    async with serving(ResponsesApi(router)) as server:  # type: ignore[arg-type]

        def client_side():
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0)
            with client.responses.stream(model="think", input="Capital of France?", reasoning={"effort": "low"}) as s:
                events = list(s)
                final = s.get_final_response()
            whole = client.responses.create(model="think", input="Capital of France?")
            refused = None
            try:
                client.responses.create(model="plain", input="hi", reasoning={"effort": "high"})
            except openai.BadRequestError as exc:
                refused = exc
            replay = list(client.responses.retrieve(final.id, stream=True, starting_after=1))
            return events, final, whole, refused, replay

        events, final, whole, refused, replay = await trio.to_thread.run_sync(client_side)
        port = server.port
        got = await trio.to_thread.run_sync(
            _http, port, "GET", f"/v1/responses/{final.id}?include=reasoning.encrypted_content"
        )
        bad = [
            await trio.to_thread.run_sync(_http, port, "GET", f"/v1/responses/{final.id}?{q}")
            for q in (
                "starting_after=2",
                "include_obfuscation=true",
                "stream=maybe",
                "include=file_search_call.results",
                "foo=1",
            )
        ]
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert deltas == ["Paris is ", "the capital."]
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done.text == "Paris is the capital." and done.item_id == final.output[0].id
    assert [o.type for o in final.output] == ["reasoning", "message"] and final.output_text == "Paris."
    assert final.output[0].content[0].text == "Paris is the capital." and final.output[0].summary == []
    assert final.usage.output_tokens_details.reasoning_tokens == 4 and final.reasoning.effort == "low"
    assert [o.type for o in whole.output] == ["reasoning", "message"]
    assert (router.requests[0].thinking, router.requests[0].thinking_budget) == (True, 1024)
    assert router.requests[1].thinking is None  # no effort asked: the model's default
    assert refused is not None and refused.status_code == 400 and "'plain'" in refused.message
    assert len(router.requests) == 2  # the refused one never reached the router
    assert [e.sequence_number for e in replay][0] == 2 and replay[-1].type == "response.completed"
    assert replay[-1].response.model_dump(exclude_none=True) == final.model_dump(exclude_none=True)
    stored = json.loads(got[1])
    assert got[0] == 200 and stored["id"] == final.id and Response.model_validate(stored) == replay[-1].response
    for (status, raw), param in zip(bad, ("starting_after", "include_obfuscation", "stream", "include", "foo")):
        assert status == 400 and json.loads(raw)["error"]["param"] == param, (param, raw)
