"""A finished ``mesh`` answer replayed as a stream (``replay_events``, hydra_node/moa/answers.py) shows
what the same answer shows whole, through every dialect's formatter: a call the member streamed
(``streamed`` set under the tool-call grammar) comes whole, and logprobs that came without text (a
call's tokens; a stop sequence's) are kept."""

from __future__ import annotations

import json

from hydra_node.anthropic.format import MessageEventStream, MessageStreamFormatter
from hydra_node.api.answer import nothing_to_close, stream_body
from hydra_node.api.chat import ChatDone, ChatOutcome, ContentDelta, ToolCallDelta
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.inference import TokenLogprob
from hydra_node.moa.answers import replay_events
from hydra_node.openai.format import ChunkMaker, ChunkStream
from hydra_node.responses.request import parse_responses_body
from hydra_node.responses.stream import ResponseEventStream, ResponseStreamFormatter

CALL = ParsedToolCall(0, "call_1", "get_weather", '{"city":"Paris"}', streamed=True)
USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
END = TokenLogprob("END", -0.1, b"END")


async def replayed(out: ChatOutcome, fmt) -> list[dict]:
    """The data of every event ``fmt`` writes for the replay of ``out``."""
    body = b"".join([c async for c in stream_body(lambda: replay_events(out), fmt, nothing_to_close)])
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]


async def test_a_replay_gives_calls_whole_and_keeps_logprobs_without_text():
    out = ChatOutcome(
        content=None, tool_calls=[CALL], finish_reason="tool_calls", usage=USAGE, served_by="h", logprobs=[END]
    )
    assert [ev async for _, ev in replay_events(out)] == [
        ContentDelta("", (END,)),
        ToolCallDelta(ParsedToolCall(0, "call_1", "get_weather", '{"city":"Paris"}')),
        ChatDone("tool_calls", USAGE, "h"),
    ]


async def test_a_streamed_call_replayed_shows_in_every_dialect():
    out = ChatOutcome(content=None, tool_calls=[CALL], finish_reason="tool_calls", usage=USAGE, served_by="h")
    chat = await replayed(out, ChunkStream(ChunkMaker("chatcmpl-1", "mesh", 0, True)))
    assert [c["choices"][0]["delta"]["tool_calls"][0]["function"] for c in chat[1:3]] == [
        {"name": "get_weather", "arguments": ""},
        {"arguments": '{"city":"Paris"}'},
    ]
    messages = await replayed(out, MessageStreamFormatter(MessageEventStream("msg_1", "mesh"), ()))
    assert [e["type"] for e in messages] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert messages[2]["content_block"]["name"] == "get_weather"
    assert messages[3]["delta"]["partial_json"] == '{"city":"Paris"}'
    call = parse_responses_body(b'{"model": "mesh", "input": "hi"}', lambda _id: None)
    final: list[dict] = []
    responses = await replayed(out, ResponseStreamFormatter(ResponseEventStream(call, "resp_1", 0), final.append))
    assert responses[-1]["type"] == "response.completed" and final == [responses[-1]["response"]]
    assert [(o["type"], o["name"], o["arguments"]) for o in final[0]["output"]] == [
        ("function_call", "get_weather", '{"city":"Paris"}')
    ]


async def test_a_stop_sequence_with_no_text_before_it_is_named_in_a_replay():
    out = ChatOutcome(content="", finish_reason="stop", usage=USAGE, served_by="h", logprobs=[END])
    events = await replayed(out, MessageStreamFormatter(MessageEventStream("msg_1", "mesh"), ("END",)))
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
