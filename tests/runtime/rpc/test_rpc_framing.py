"""RpcFramer: the pump's cuts of a ggml RPC byte stream (never its bytes)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.runtime.rpc.framing import CMD_GRAPH_COMPUTE, CMD_SET_TENSOR, NO_REPLY_COMMANDS, RpcFramer

GET_TENSOR, HELLO = 8, 14


def request(cmd: int, payload: bytes) -> bytes:
    return bytes([cmd]) + struct.pack("<Q", len(payload)) + payload


def response(payload: bytes) -> bytes:
    return struct.pack("<Q", len(payload)) + payload


def feed_pieces(framer: RpcFramer, data: bytes, cuts: list[int]) -> list[bytes]:
    out, last = [], 0
    for c in sorted(set(cuts)) + [len(data)]:
        if ready := framer.feed(data[last:c]):
            out.append(ready)
        last = c
    return out


def test_a_request_written_in_three_sends_is_one_chunk():
    f = RpcFramer("request", 65536)
    msg = request(GET_TENSOR, b"x" * 40)
    assert f.feed(msg[:1]) == b"" and f.feed(msg[1:9]) == b"" and f.held == 9
    assert f.feed(msg[9:]) == msg and f.held == 0


def test_no_reply_requests_wait_for_the_next_request_that_expects_one():
    f = RpcFramer("request", 65536)
    batch = request(CMD_SET_TENSOR, b"a" * 100) + request(CMD_GRAPH_COMPUTE, b"g" * 50)
    assert f.feed(batch) == b"" and f.held == len(batch)
    get = request(GET_TENSOR, b"q" * 24)
    assert f.feed(get + batch[:5]) == batch + get and f.held == 5
    # ... or for the pump's hold timeout
    assert f.feed(batch[5:]) == b"" and f.flush() == batch


def test_big_payloads_stream_in_max_chunk_pieces():
    f = RpcFramer("request", 1000)
    msg = request(CMD_SET_TENSOR, bytes(range(256)) * 20)
    chunks = feed_pieces(f, msg, list(range(0, len(msg), 300)))
    assert all(len(c) >= 1000 for c in chunks) and b"".join(chunks) + f.flush() == msg


def test_responses_are_cut_at_each_end():
    f = RpcFramer("response", 65536)
    a, b = response(b"r" * 10), response(b"")
    assert f.feed(a[:5]) == b"" and f.feed(a[5:] + b) == a + b


def test_an_unknown_command_switches_to_pass_through():
    f = RpcFramer("request", 65536)
    assert f.feed(bytes([200]) + b"\x01" * 8 + b"rest") == bytes([200]) + b"\x01" * 8 + b"rest"
    assert f.passthrough and f.feed(b"more") == b"more" and f.held == 0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        RpcFramer("sideways", 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RpcFramer("request", 0)


messages = st.lists(
    st.tuples(st.sampled_from([0, 3, 8, 9, 11, 13, 14, 15, *sorted(NO_REPLY_COMMANDS)]), st.binary(max_size=300)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    msgs=messages,
    cuts=st.lists(st.integers(0, 4000), max_size=20),
    max_chunk=st.integers(1, 700),
    direction=st.sampled_from(["request", "response"]),
)
def test_bytes_are_never_changed_and_cuts_follow_the_rules(msgs, cuts, max_chunk, direction):
    f = RpcFramer(direction, max_chunk)
    if direction == "request":
        encoded = [request(c, p) for c, p in msgs]
        awaited = [c not in NO_REPLY_COMMANDS for c, _ in msgs]
    else:
        encoded = [response(p) for _, p in msgs]
        awaited = [True] * len(msgs)
    data = b"".join(encoded)
    chunks = feed_pieces(f, data, [c for c in cuts if c < len(data)])
    assert b"".join(chunks) + f.flush() == data
    assert all(chunks)
    # Once a message that a client waits for is complete, nothing before its end is held.
    ends, pos = [], 0
    for e in encoded:
        pos += len(e)
        ends.append(pos)
    last_awaited_end = max((end for end, a in zip(ends, awaited) if a), default=0)
    assert sum(map(len, chunks)) >= last_awaited_end
    # Every cut is at the end of an awaited message or after at least max_chunk bytes.
    sent = 0
    for c in chunks:
        sent += len(c)
        assert (sent in ends and awaited[ends.index(sent)]) or len(c) >= max_chunk


def test_between_messages_tells_a_finished_no_reply_request_from_a_half_read_one():
    f = RpcFramer("request", 65536)
    msg = request(CMD_SET_TENSOR, b"t" * 30)
    assert f.between_messages
    f.feed(msg[:9])
    assert f.held == 9 and not f.between_messages and f.wanted == 30
    f.feed(msg[9:20])
    assert not f.between_messages and f.wanted == 19
    f.feed(msg[20:])
    assert f.held == len(msg) and f.between_messages and f.wanted == 9
