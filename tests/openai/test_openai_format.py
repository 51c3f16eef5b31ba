"""OpenAI response shapes (pure): logprobs (chat and legacy), usage sums, streamed tool-call chunks."""

from __future__ import annotations

import json

from hydra_node.api.chat import ChatOutcome
from hydra_node.api.chat import sum_usage
from hydra_node.openai.format import ChunkMaker, chat_choice, chat_logprobs, completion_choice, completion_logprobs
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.inference import TokenLogprob

A = TokenLogprob("Hel", -0.5, b"Hel", (("Hel", -0.5, b"Hel"), ("Hi", -1.5, b"Hi")))
B = TokenLogprob("lo", -0.25, b"lo", (("lo", -0.25, b"lo"), ("p", -2.0, b"p")))


def chunks(raw: bytes) -> list[dict]:
    return [json.loads(part[6:]) for part in raw.decode().split("\n\n") if part]


def test_chat_logprobs_shape():
    lp = chat_logprobs([A, B])
    assert lp["refusal"] is None
    assert lp["content"][0] == {
        "token": "Hel",
        "logprob": -0.5,
        "bytes": [72, 101, 108],
        "top_logprobs": [
            {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]},
            {"token": "Hi", "logprob": -1.5, "bytes": [72, 105]},
        ],
    }


def test_completion_logprobs_shape_and_offsets():
    lp = completion_logprobs([A, B], 1, offset=3)
    assert lp == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"Hel": -0.5}, {"lo": -0.25}],
        "text_offset": [3, 6],
    }
    assert completion_logprobs([A], 0)["top_logprobs"] is None


def test_usage_is_summed_over_choices():
    u = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": 1}}
    assert sum_usage([u, u]) == {
        "prompt_tokens": 10,
        "completion_tokens": 6,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 2},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def test_chat_choice_with_tool_calls():
    call = ParsedToolCall(0, "call_x", "get_weather", '{"city":"Paris"}')
    c = chat_choice(1, ChatOutcome(content=None, tool_calls=[call], finish_reason="tool_calls"), logprobs=False)
    assert c["index"] == 1 and c["finish_reason"] == "tool_calls" and c["logprobs"] is None
    assert c["message"]["content"] is None and c["message"]["tool_calls"] == [
        {"id": "call_x", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    ]
    plain = chat_choice(0, ChatOutcome(content="hi", logprobs=[A]), logprobs=True)
    assert "tool_calls" not in plain["message"] and plain["logprobs"]["content"][0]["token"] == "Hel"


def test_completion_choice_echoes_the_prompt():
    c = completion_choice(0, ChatOutcome(content=" world", finish_reason="length"), "hello", None)
    assert c == {"index": 0, "text": "hello world", "logprobs": None, "finish_reason": "length"}


def test_streamed_tool_call_is_two_chunks_like_openai():
    m = ChunkMaker("chatcmpl-1", "m", 0, chat=True)
    first, second = chunks(m.tool_call(2, ParsedToolCall(1, "call_y", "f", '{"a":1}')))
    assert first["choices"][0]["index"] == 2
    assert first["choices"][0]["delta"]["tool_calls"] == [
        {"index": 1, "id": "call_y", "type": "function", "function": {"name": "f", "arguments": ""}}
    ]
    assert second["choices"][0]["delta"]["tool_calls"] == [{"index": 1, "function": {"arguments": '{"a":1}'}}]
    (fin,) = chunks(m.finish(2, "tool_calls", "node-a"))
    assert fin["choices"][0] == {"index": 2, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    assert fin["system_fingerprint"] == "node-a"


def test_streamed_completion_logprob_offsets_follow_the_tokens():
    m = ChunkMaker("cmpl-1", "m", 0, chat=False, completion_top=1)
    (a,) = chunks(m.text(0, "Hel", (A,)))
    (b,) = chunks(m.text(0, "lo", (B,)))
    assert a["choices"][0]["logprobs"]["text_offset"] == [0] and b["choices"][0]["logprobs"]["text_offset"] == [3]
    (c,) = chunks(ChunkMaker("chatcmpl-2", "m", 0, chat=True, logprobs=True).text(0, "Hel", (A,)))
    assert c["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5
