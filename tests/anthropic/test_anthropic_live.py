"""/v1/messages on a live node with the real bundled model, driven by the official ``anthropic`` SDK.

The node requires a key, so the SDK's ``x-api-key`` (and ``Authorization: Bearer`` through
``auth_token``) are checked for real. Greedy outputs are compared (stream vs whole), so the node
evaluates every prompt from scratch."""

from __future__ import annotations

import json

import anthropic
import pytest
from harness import SHARED_API_KEY

from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
KEY = SHARED_API_KEY
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
#: This SDK has no ``temperature`` argument any more; the API still takes it (greedy: comparable answers).
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def node(shared_keyed_node):
    """The session's shared keyed node (tests/conftest.py): it requires KEY; prompt cache off."""
    return shared_keyed_node


@pytest.fixture(scope="module")
def client(node):
    return anthropic.Anthropic(base_url=node.base_url.removesuffix("/v1"), api_key=KEY, max_retries=0, timeout=120)


def test_text_message_and_its_stream_agree(client):
    kw = dict(
        model=MODEL,
        system="Answer in one short sentence.",
        max_tokens=16,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Name a colour."}],
    )
    whole = client.messages.create(**kw)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert whole.content[0].type == "text" and whole.content[0].text
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens <= 16
    assert whole.usage.input_tokens > 0 and whole.model == MODEL
    with client.messages.stream(**kw) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        whole.usage.input_tokens,
        whole.usage.output_tokens,
    )


def test_claude_names_map_to_the_mesh_model(client):
    out = client.messages.create(
        model="claude-from-a-client", max_tokens=4, extra_body=GREEDY, messages=[{"role": "user", "content": "Hi"}]
    )
    assert out.model == MODEL


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_is_a_tool_use_block(client, stream):
    kw = dict(
        model=MODEL,
        max_tokens=48,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=ASK,
    )
    if stream:
        with client.messages.stream(**kw) as s:
            deltas = [
                ev.delta.partial_json
                for ev in s
                if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta"
            ]
            out = s.get_final_message()
        assert deltas and json.loads("".join(deltas)) == out.content[-1].input
    else:
        out = client.messages.create(**kw)
    block = out.content[-1]
    assert out.stop_reason == "tool_use" and block.type == "tool_use" and block.name == "get_weather"
    assert block.id.startswith("toolu_") and isinstance(block.input["city"], str) and block.input["city"]


def test_any_tool_choice_and_a_tool_result_round_trip(client):
    first = client.messages.create(
        model=MODEL, max_tokens=48, extra_body=GREEDY, tools=[WEATHER], tool_choice={"type": "any"}, messages=ASK
    )
    use = first.content[-1]
    assert use.type == "tool_use"
    history = ASK + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 degrees Celsius."}],
        },
    ]
    kw = dict(model=MODEL, max_tokens=24, extra_body=GREEDY, tools=[WEATHER], tool_choice={"type": "none"})
    second = client.messages.create(messages=history, **kw)
    assert second.content[0].type == "text" and second.content[0].text and second.stop_reason != "tool_use"
    without = client.messages.create(messages=ASK, **kw)
    assert second.usage.input_tokens > without.usage.input_tokens + 10  # the call and its result reached the prompt


def test_stop_sequences_and_max_tokens(client):
    free = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Describe Paris in two sentences."}],
    )
    text = free.content[0].text
    stop = next(w for w in text.split()[1:] if len(w) > 3)
    cut = client.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        stop_sequences=["@@@", stop],
        messages=[{"role": "user", "content": "Describe Paris in two sentences."}],
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]
    short = client.messages.create(
        model=MODEL,
        max_tokens=3,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Describe Paris in two sentences."}],
    )
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_count_tokens_matches_the_generations_input(client):
    kw = dict(model=MODEL, system="Be brief.", messages=[{"role": "user", "content": "Name a colour."}])
    counted = client.messages.count_tokens(**kw)
    made = client.messages.create(max_tokens=2, extra_body=GREEDY, **kw)
    assert counted.input_tokens == made.usage.input_tokens > 0


def test_errors_are_anthropic_shaped(client, node):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                    ],
                }
            ],
        )
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="no-such-model", max_tokens=8, messages=ASK)
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=client.base_url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=ASK
        )
    bearer = anthropic.Anthropic(base_url=client.base_url, auth_token=KEY, max_retries=0, timeout=120)
    assert bearer.messages.create(model=MODEL, max_tokens=2, messages=ASK).usage.output_tokens >= 1
