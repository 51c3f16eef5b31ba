"""/v1/messages with a reasoning model: ``thinking`` validated as Anthropic validates it and mapped to
the request fields (refused on a model that does not reason), thinking blocks in the history,
thinking content blocks and their stream events (``thinking_delta``, ``signature_delta`` just before
the block's stop), and the anthropic SDK reading both, over a real loopback server with a stand-in
for the router."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import anthropic
import pytest
import trio
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from api_serving import serving
from hydra_node.anthropic.format import THINKING_SIGNATURE, MessageEventStream, message_body
from hydra_node.anthropic.request import FORCED_TOOL_WITH_THINKING, parse_count_tokens_body, parse_messages_body
from hydra_node.anthropic.routes import MessagesApi, generation_request
from hydra_node.api.errors import ApiError
from hydra_node.inference import NO_CAPS, ChatMessage, Finished, ModelCaps, TextDelta

EVENTS = TypeAdapter(RawMessageStreamEvent)
THINKS = ModelCaps("think", thinks=True, switch=True)
NO_SWITCH = ModelCaps("think", thinks=True)
WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
ENABLED = {"type": "enabled", "budget_tokens": 2000}


def body(**kw) -> bytes:
    base = {"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}], **kw}
    return json.dumps(base).encode()


def refused(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_messages_body(raw)
    return info.value


def test_thinking_is_validated_as_anthropic_validates_it():
    assert refused(body(thinking={"type": "enabled", "budget_tokens": 1000})).param == "thinking.budget_tokens"
    err = refused(body(thinking=ENABLED, max_tokens=2000))
    assert err.param == "max_tokens" and "greater than 'thinking.budget_tokens'" in err.message
    err = refused(body(thinking=ENABLED, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}))
    assert err.message == FORCED_TOOL_WITH_THINKING and err.param == "tool_choice"
    assert refused(body(thinking={"type": "disabled", "budget_tokens": 2000})).param == "thinking.budget_tokens"
    assert refused(body(thinking={"type": "enabled", "budget_tokens": 2000, "display": "full"})).param == (
        "thinking.display"
    )
    # auto and none are allowed with thinking; count_tokens has no max_tokens to compare with
    assert (
        parse_messages_body(body(thinking=ENABLED, tools=[WEATHER], tool_choice={"type": "auto"})).thinking == "enabled"
    )
    counted = parse_count_tokens_body(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "thinking": ENABLED}).encode()
    )
    assert (counted.thinking, counted.budget_tokens) == ("enabled", 2000)


def test_thinking_becomes_the_request_fields_for_the_model():
    def fields(caps, **kw):
        req = generation_request(parse_messages_body(body(**kw)), "msg_1", caps=caps)
        return req.thinking, req.thinking_budget, req.reasoning_effort

    assert fields(THINKS, thinking=ENABLED) == (True, 2000, "")
    assert fields(THINKS, thinking={"type": "disabled"}) == (False, None, "")
    assert fields(NO_SWITCH, thinking={"type": "disabled"}) == (None, 0, "")  # no switch: a zero budget
    assert fields(THINKS, thinking={"type": "adaptive"}) == (None, None, "")  # the model's default
    assert fields(THINKS, thinking={"type": "adaptive"}, output_config={"effort": "low"}) == (True, 1024, "low")
    assert fields(THINKS, thinking=ENABLED, output_config={"effort": "high"}) == (True, 2000, "high")
    # a model that does not reason: nothing to disable or adapt, but enabled thinking is refused
    assert fields(NO_CAPS, thinking={"type": "disabled"}) == (None, None, "")
    assert fields(NO_CAPS, thinking={"type": "adaptive", "display": "omitted"}, output_config={"effort": "high"}) == (
        None,
        None,
        "",
    )
    with pytest.raises(ApiError) as info:
        fields(NO_CAPS, thinking=ENABLED)
    assert info.value.status == 400 and info.value.param == "thinking" and "'m'" in info.value.message


def test_thinking_blocks_in_the_history_are_the_turns_reasoning():
    history = [
        {"role": "user", "content": "q1"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "T1", "signature": THINKING_SIGNATURE},
                {"type": "redacted_thinking", "data": "EncryptedByAnthropic"},
                {"type": "text", "text": "a1"},
            ],
        },
        {"role": "user", "content": "q2"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "T2", "signature": "sig-from-elsewhere"},
                {"type": "text", "text": "a2"},
            ],
        },
        {"role": "user", "content": "q3"},
    ]
    call = parse_messages_body(body(messages=history))
    assert [m for m in call.messages if m.role == "assistant"] == [
        ChatMessage("assistant", "a1", reasoning="T1"),  # the redacted block is dropped
        ChatMessage("assistant", "a2", reasoning="T2"),
    ]
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]}
    cleared = parse_messages_body(body(messages=history, context_management=edits))
    assert [m.reasoning for m in cleared.messages if m.role == "assistant"] == ["", "T2"]
    kept = parse_messages_body(
        body(messages=history, context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})
    )
    assert [m.reasoning for m in kept.messages if m.role == "assistant"] == ["T1", "T2"]


def test_the_message_has_a_thinking_block_first():
    usage = {"input_tokens": 3, "output_tokens": 9}
    msg = Message.model_validate(message_body("msg_1", "m", "Paris.", [], "end_turn", None, usage, (), "Hmm."))
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert (msg.content[0].thinking, msg.content[0].signature) == ("Hmm.", THINKING_SIGNATURE)
    omitted = message_body("msg_1", "m", "Paris.", [], "end_turn", None, usage, (), "Hmm.", show_thinking=False)
    assert omitted["content"][0] == {"type": "thinking", "thinking": "", "signature": THINKING_SIGNATURE}
    assert [b["type"] for b in message_body("msg_1", "m", "Paris.", [], "end_turn", None, usage)["content"]] == ["text"]


def test_the_stream_sends_thinking_deltas_then_the_signature_then_the_text():
    s = MessageEventStream("msg_1", "m")
    evs = s.start() + s.thinking_delta("Hm") + s.thinking_delta("m.") + s.text_delta("Paris.")
    evs += s.finish("end_turn", None, {"input_tokens": 5, "output_tokens": 9})
    for ev in evs:
        if ev["type"] != "ping":  # the SDK reads pings apart
            EVENTS.validate_python(ev)
    shape = [(e["type"], e.get("index"), e.get("delta", {}).get("type")) for e in evs]
    assert shape == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert evs[2]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert evs[5]["delta"]["signature"] == THINKING_SIGNATURE
    hidden = MessageEventStream("msg_1", "m", show_thinking=False)
    evs = hidden.start() + hidden.thinking_delta("Hmm.") + hidden.text_delta("Paris.")
    assert [e.get("delta", {}).get("type") for e in evs if e["type"] == "content_block_delta"] == [
        "signature_delta",
        "text_delta",
    ]


class ThinkingRouter:
    """A stand-in for the router: model "think" reasons (its host splits thoughts from the answer,
    as TextDelta.reasoning), "plain" does not. Records every request."""

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
            yield TextDelta("", reasoning="The capital ")
            yield TextDelta("", reasoning="is Paris.")
            yield TextDelta("Paris.")
            yield Finished("stop", 9, 6, reasoning_tokens=4)

        yield events()


async def test_the_anthropic_sdk_reads_thinking_whole_and_streamed():
    router = ThinkingRouter()
    async with serving(MessagesApi(router)) as server:  # type: ignore[arg-type]

        def client_side():
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="x", max_retries=0)
            ask = {"max_tokens": 4096, "messages": [{"role": "user", "content": "Capital of France?"}]}
            whole = client.messages.create(model="think", thinking=ENABLED, **ask)
            with client.messages.stream(model="think", thinking=ENABLED, **ask) as stream:
                events = list(stream)
                final = stream.get_final_message()
            again = client.messages.create(
                model="think",
                max_tokens=64,
                messages=[
                    *ask["messages"],
                    {"role": "assistant", "content": final.content},
                    {"role": "user", "content": "And Italy?"},
                ],
            )
            try:
                client.messages.create(model="plain", thinking=ENABLED, **ask)
            except anthropic.BadRequestError as exc:
                return whole, events, final, again, exc
            raise AssertionError("thinking on a model that does not reason was not refused")

        whole, events, final, again, exc = await trio.to_thread.run_sync(client_side)
    for msg in (whole, final):
        assert [b.type for b in msg.content] == ["thinking", "text"]
        assert msg.content[0].thinking == "The capital is Paris." and msg.content[0].signature == THINKING_SIGNATURE
        assert msg.content[1].text == "Paris." and msg.usage.output_tokens == 6  # thinking counts in output_tokens
    assert [e.thinking for e in events if e.type == "thinking"] == ["The capital ", "is Paris."]
    assert [e.signature for e in events if e.type == "signature"] == [THINKING_SIGNATURE]
    assert again.content[0].type == "thinking"
    assert (router.requests[0].thinking, router.requests[0].thinking_budget) == (True, 2000)
    assert router.requests[2].messages[1] == ChatMessage("assistant", "Paris.", reasoning="The capital is Paris.")
    assert exc.status_code == 400 and "'plain'" in exc.message and len(router.requests) == 3


def test_claude_codes_display_updates_shows_the_thoughts():
    """Claude Code 2.1 sends ``display: "updates"`` first; refusing it cost it two retries a turn."""
    call = parse_messages_body(body(thinking={"type": "adaptive", "display": "updates"}))
    assert call.thinking == "adaptive" and call.show_thinking
