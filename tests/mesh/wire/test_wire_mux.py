"""Stream multiplexer back to back in memory: flow control, priority, state machine, hostile frames."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.mesh.wire.constants import (
    BULK_WINDOW_BYTES,
    DATA_CHUNK_BYTES,
    MAX_STREAMS_PER_LINK,
    STREAM_WINDOW_BYTES,
)
from hydra_node.mesh.wire.errors import FlowControlError, LocalProtocolError, RemoteProtocolError
from hydra_node.mesh.wire.frames import Close, Data, Message, Open, Reset, Window, decode_frame, encode_frame
from hydra_node.mesh.wire.mux import (
    DataReceived,
    MessageReceived,
    Multiplexer,
    StreamEnded,
    StreamOpened,
    StreamWasReset,
    WindowOpened,
)


def pump(sender: Multiplexer, receiver: Multiplexer, limit: int = 10_000) -> list[object]:
    events: list[object] = []
    for _ in range(limit):
        frame = sender.next_frame()
        if frame is None:
            return events
        events.extend(receiver.receive_frame(frame))
    raise AssertionError("pump did not go idle")


def received_bytes(events: list[object], stream_id: int) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, DataReceived) and e.stream_id == stream_id)


def test_open_data_eof_both_ways() -> None:
    a, b = Multiplexer(is_initiator=True), Multiplexer(is_initiator=False)
    sid = a.open_stream({"kind": "generate"})
    assert sid == 1
    a.send_data(sid, b"request")
    a.send_eof(sid)
    events = pump(a, b)
    assert events[0] == StreamOpened(1, {"kind": "generate"})
    assert received_bytes(events, 1) == b"request"
    assert events[-1] == StreamEnded(1)
    b.send_data(sid, b"reply")
    b.send_eof(sid)
    events = pump(b, a)
    assert received_bytes(events, 1) == b"reply" and events[-1] == StreamEnded(1)
    assert not a.is_open(sid) and not b.is_open(sid)
    with pytest.raises(LocalProtocolError):
        a.send_data(sid, b"late")


def test_flow_control_stops_at_window_and_resumes_on_consumption() -> None:
    a, b = Multiplexer(is_initiator=True), Multiplexer(is_initiator=False)
    sid = a.open_stream({"kind": "bulk"})
    payload = bytes(range(256)) * 4096  # 1 MiB
    a.send_data(sid, payload)
    got = received_bytes(pump(a, b), sid)
    assert len(got) == STREAM_WINDOW_BYTES  # no credit left: the sender holds the rest
    assert a.buffered(sid) == len(payload) - STREAM_WINDOW_BYTES
    while len(got) < len(payload):
        b.consumed(sid, STREAM_WINDOW_BYTES)
        assert any(isinstance(e, WindowOpened) for e in pump(b, a))
        got += received_bytes(pump(a, b), sid)
    assert got == payload


def test_a_grown_window_lets_more_through_and_is_topped_up_at_its_half() -> None:
    a, b = Multiplexer(is_initiator=True), Multiplexer(is_initiator=False)
    sid = a.open_stream({"kind": "bulk"})
    pump(a, b)
    b.grow_window(sid, BULK_WINDOW_BYTES)
    b.grow_window(sid, STREAM_WINDOW_BYTES)  # never shrinks, and sends nothing
    b.grow_window(sid, BULK_WINDOW_BYTES)  # nothing more either
    window_frames = [decode_frame(f) for f in iter(b.next_frame, None)]
    assert window_frames == [Window(sid, BULK_WINDOW_BYTES - STREAM_WINDOW_BYTES)]
    for f in window_frames:
        a.receive_frame(encode_frame(f))
    payload = bytes(range(256)) * (BULK_WINDOW_BYTES // 128)  # twice the window
    a.send_data(sid, payload)
    got = received_bytes(pump(a, b), sid)
    assert len(got) == BULK_WINDOW_BYTES  # the whole grown window, and not a byte more
    b.consumed(sid, STREAM_WINDOW_BYTES)  # far below half the grown window: no WINDOW yet
    assert b.next_frame() is None
    b.consumed(sid, BULK_WINDOW_BYTES // 2 - STREAM_WINDOW_BYTES)
    assert [decode_frame(f) for f in iter(b.next_frame, None)] == [Window(sid, BULK_WINDOW_BYTES // 2)]
    for _ in range(BULK_WINDOW_BYTES // 2 // DATA_CHUNK_BYTES):  # exactly the credit granted back
        b.receive_frame(encode_frame(Data(sid, b"x" * DATA_CHUNK_BYTES)))
    with pytest.raises(FlowControlError):  # and credit is still enforced at the grown size
        b.receive_frame(encode_frame(Data(sid, b"x")))


@pytest.mark.parametrize("window", [STREAM_WINDOW_BYTES - 1, BULK_WINDOW_BYTES + 1])
def test_a_window_outside_the_bounds_is_refused(window) -> None:
    b = Multiplexer(is_initiator=False)
    with pytest.raises(LocalProtocolError):
        b.grow_window(1, window)


def test_priority_lane_and_round_robin() -> None:
    a = Multiplexer(is_initiator=True)
    s1, s3 = a.open_stream({}), a.open_stream({})
    a.send_data(s1, b"1" * (3 * DATA_CHUNK_BYTES))
    a.send_data(s3, b"3" * (3 * DATA_CHUNK_BYTES))
    kinds = [decode_frame(a.next_frame()) for _ in range(2)]
    assert all(isinstance(f, Open) for f in kinds)
    first = decode_frame(a.next_frame())
    a.send_message({"t": "gossip"})  # queued behind a bulk transfer, sent next anyway
    assert isinstance(decode_frame(a.next_frame()), Message)
    order = [first.stream_id] + [decode_frame(a.next_frame()).stream_id for _ in range(3)]
    assert order == [s1, s3, s1, s3]


def test_reset_drops_unsent_data_and_reaches_the_peer() -> None:
    a, b = Multiplexer(is_initiator=True), Multiplexer(is_initiator=False)
    sid = a.open_stream({})
    pump(a, b)
    a.send_data(sid, b"x" * 1000)
    a.reset_stream(sid, "cancel", "client went away")
    events = pump(a, b)
    assert events == [StreamWasReset(sid, "cancel", "client went away")]
    # frames of the dead stream that were already in flight are ignored, not fatal
    assert a.receive_frame(encode_frame(Data(sid, b"late"))) == []
    assert a.late_frames == 1


def test_peer_beyond_credit_is_a_flow_control_error() -> None:
    a, b = Multiplexer(is_initiator=True), Multiplexer(is_initiator=False)
    sid = a.open_stream({})
    pump(a, b)
    for _ in range(STREAM_WINDOW_BYTES // DATA_CHUNK_BYTES):
        b.receive_frame(encode_frame(Data(sid, b"z" * DATA_CHUNK_BYTES)))
    with pytest.raises(FlowControlError) as info:
        b.receive_frame(encode_frame(Data(sid, b"z")))
    assert info.value.code == "flow_control"


@pytest.mark.parametrize(
    "frames",
    [
        [Data(1, b"x")],  # never opened
        [Open(2, {})],  # wrong parity for the initiator's streams
        [Open(3, {}), Open(1, {})],  # ids must increase
        [Open(1, {}), Close(1), Data(1, b"x")],  # data after the peer's EOF
        [Open(1, {}), Close(1), Close(1)],
        [Open(1, {}), Window(1, 2**31 - 1)],  # credit overflow
    ],
)
def test_stream_state_violations_are_remote_errors(frames: list[object]) -> None:
    b = Multiplexer(is_initiator=False)
    with pytest.raises(FlowControlError):
        for frame in frames:
            b.receive_frame(encode_frame(frame))


def test_too_many_streams_are_refused() -> None:
    b = Multiplexer(is_initiator=False)
    for i in range(MAX_STREAMS_PER_LINK):
        assert b.receive_frame(encode_frame(Open(2 * i + 1, {})))
    assert b.receive_frame(encode_frame(Open(2 * MAX_STREAMS_PER_LINK + 1, {}))) == []
    assert decode_frame(b.next_frame()) == Reset(
        2 * MAX_STREAMS_PER_LINK + 1, "refused", f"more than {MAX_STREAMS_PER_LINK} open streams"
    )


def test_messages_pass_through() -> None:
    a, b = Multiplexer(is_initiator=True), Multiplexer(is_initiator=False)
    a.send_message({"seq": 1})
    assert pump(a, b) == [MessageReceived({"seq": 1})]


small_ids = st.integers(0, 6)
hostile = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda i, h: bytes([1]) + i.to_bytes(4, "big") + h, small_ids, st.sampled_from([b"\xa0", b"\x80", b""])),
    st.builds(lambda i, n: bytes([2]) + i.to_bytes(4, "big") + b"d" * n, small_ids, st.integers(0, 70_000)),
    st.builds(lambda k, i: bytes([k]) + i.to_bytes(4, "big"), st.integers(1, 9), small_ids),
    st.builds(
        lambda i, n: bytes([5]) + i.to_bytes(4, "big") + n.to_bytes(4, "big"), small_ids, st.integers(0, 2**32 - 1)
    ),
)


@settings(max_examples=300)
@given(st.lists(hostile, max_size=25))
def test_hostile_frame_sequences_only_raise_remote_errors(blobs: list[bytes]) -> None:
    b = Multiplexer(is_initiator=False)
    for blob in blobs:
        try:
            b.receive_frame(blob)
        except RemoteProtocolError:
            return
        while b.next_frame() is not None:  # replies we would send stay well-formed
            pass
