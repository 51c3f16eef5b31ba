"""A generation's events as chat events: tool-call text parsed into calls, logprobs kept, the finish reason
`tool_calls` when calls were made (the events are the real TextDelta/Finished a runner or peer sends)."""

from __future__ import annotations

import json

import pytest

from hydra_node.api.chat import ChatDone, ContentDelta, ToolCallDelta, chat_events
from hydra_node.grammar.constraints import tool_call_grammar
from hydra_node.inference import Finished, GenerationError, GenerationRequest, TextDelta, TokenLogprob, ToolSpec

TOOLS = (ToolSpec("get_weather", "", json.dumps({"type": "object", "properties": {"city": {"type": "string"}}})),)
LP = TokenLogprob("x", -0.1, b"x")


def request(**kw) -> GenerationRequest:
    return GenerationRequest(model="m", kind="chat", messages=(("user", "hi"),), **kw)


async def run(req: GenerationRequest, events: list) -> list:
    async def source():
        for ev in events:
            yield ev

    return [ev async for ev in chat_events(req, source())]


FIN = Finished("stop", prompt_tokens=7, completion_tokens=20, served_by="node-a", cached_tokens=3)


async def test_calls_split_across_deltas_become_tool_call_events():
    text = 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    deltas = [TextDelta(text[i : i + 7], (LP,)) for i in range(0, len(text), 7)]
    out = await run(request(tools=TOOLS), [*deltas, FIN])
    content = "".join(e.text for e in out if isinstance(e, ContentDelta))
    calls = [e.call for e in out if isinstance(e, ToolCallDelta)]
    assert content == "Let me check."
    assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == [(0, "get_weather", {"city": "Paris"})]
    assert sum(len(e.logprobs) for e in out if isinstance(e, ContentDelta)) == len(deltas)  # none lost
    assert out[-1] == ChatDone(
        "tool_calls",
        {
            "prompt_tokens": 7,
            "completion_tokens": 20,
            "total_tokens": 27,
            "prompt_tokens_details": {"cached_tokens": 3},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
        "node-a",
    )


async def test_tool_choice_none_passes_text_through():
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    out = await run(request(tools=TOOLS, tool_choice="none"), [TextDelta(text), FIN])
    assert out[0] == ContentDelta(text) and out[-1].finish_reason == "stop"


async def test_malformed_call_stays_content_and_length_is_kept():
    text = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    out = await run(request(tools=TOOLS), [TextDelta(text), Finished("length", 1, 2)])
    assert "".join(e.text for e in out if isinstance(e, ContentDelta)) == text
    assert out[-1].finish_reason == "length"


async def test_a_stream_without_finished_is_an_error():
    with pytest.raises(GenerationError) as e:
        await run(request(), [TextDelta("hi")])
    assert e.value.status == 502


FORCED = dict(tools=TOOLS, tool_choice="required", grammar=tool_call_grammar(TOOLS, name=None, parallel=False))


async def test_under_the_tool_grammar_a_call_streams_start_fragments_end():
    from hydra_node.api.chat import ToolCallArguments, ToolCallStart

    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    deltas = [TextDelta(text[i : i + 9], (LP,)) for i in range(0, len(text), 9)]
    out = await run(request(**FORCED), [*deltas, FIN])
    kinds = [type(e).__name__ for e in out if not isinstance(e, ContentDelta)]
    assert kinds[0] == "ToolCallStart" and kinds[-2:] == ["ToolCallDelta", "ChatDone"]
    assert set(kinds[1:-2]) == {"ToolCallArguments"} and len(kinds[1:-2]) > 1
    assert out[[type(e) for e in out].index(ToolCallStart)] == ToolCallStart(0, out[-2].call.id, "get_weather")
    assert "".join(e.text for e in out if isinstance(e, ToolCallArguments)) == '{"city": "Paris"}'
    assert out[-2].call.arguments == '{"city":"Paris"}' and out[-2].call.streamed
    assert not "".join(e.text for e in out if isinstance(e, ContentDelta))  # no call text as content
    assert sum(len(e.logprobs) for e in out if isinstance(e, ContentDelta)) == len(deltas)
    assert out[-1].finish_reason == "tool_calls"
    # the same without a grammar: one whole call, the same arguments
    whole = await run(request(tools=TOOLS, tool_choice="required"), [*deltas, FIN])
    assert [type(e).__name__ for e in whole if not isinstance(e, ContentDelta)] == ["ToolCallDelta", "ChatDone"]
    assert whole[-2].call.arguments == out[-2].call.arguments and not whole[-2].call.streamed


async def test_a_streamed_call_cut_by_max_tokens_finishes_with_length():
    from hydra_node.api.chat import ToolCallArguments

    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    out = await run(request(**FORCED), [TextDelta(text[:30]), TextDelta(text[30:]), Finished("length", 1, 2)])
    assert "".join(e.text for e in out if isinstance(e, ToolCallArguments)) == '{"city": "Par'
    assert not any(e.text for e in out if isinstance(e, ContentDelta))
    assert out[-2].call.arguments == '{"city": "Par' and not out[-2].call.complete
    assert out[-1].finish_reason == "length"
