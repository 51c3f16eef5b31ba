"""Generate-stream events and runner answers: any input gives a typed event or one typed error.

A remote error is never relayed as success: a peer's failure becomes 502 or 503 with its message.
"""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.inference import (
    EventStreamDecoder,
    Finished,
    GenerationError,
    GenerationRequest,
    InvalidRequest,
    QueueFull,
    RemoteError,
    MalformedRemoteEvent,
    TextDelta,
    event_frame,
    event_from_wire,
)
from hydra_node.runtime.child.channel import (
    ChannelError,
    FrameDecoder,
    RunnerProtocolError,
    encode_frame,
    runner_event_from_wire,
)

leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=8)
    | st.text(max_size=8)
)
values = st.recursive(
    leaves, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=10
)
EVENT_KEYS = [
    "type",
    "text",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "queue_wait_ms",
    "ttft_ms",
    "itl_ms",
    "served_by",
    "cached_tokens",
    "message",
    "code",
    "status",
    "retryable",
    "retry_after",
]
event_like = st.builds(
    lambda t, rest: {**rest, "type": t},
    st.sampled_from(["delta", "finished", "error", "x"]),
    st.dictionaries(st.sampled_from(EVENT_KEYS), leaves, max_size=8),
)


@settings(max_examples=400)
@given(event_like | values)
def test_event_from_wire_gives_an_event_or_a_remote_error(d: Any) -> None:
    try:
        ev = event_from_wire(d)
    except RemoteError as exc:
        assert exc.status in (502, 503) and exc.code and exc.message
    else:
        assert isinstance(ev, (TextDelta, Finished))


@settings(max_examples=300)
@given(st.binary(max_size=200), st.sampled_from([None, 1]))
def test_event_stream_decoder_on_any_bytes(data: bytes, chunk: int | None) -> None:
    decoder = EventStreamDecoder()
    pieces = [data] if chunk is None else [data[i : i + 1] for i in range(len(data))]
    try:
        for piece in pieces:
            decoder.receive_data(piece)
            while (ev := decoder.next_event()) is not None:
                assert isinstance(ev, (TextDelta, Finished))
    except RemoteError as exc:
        assert exc.status in (502, 503)


@given(st.lists(st.text(max_size=20), max_size=5), st.binary(max_size=30))
def test_event_stream_whole_byte_by_byte_and_trailing_junk(texts: list[str], junk: bytes) -> None:
    events = [TextDelta(t) for t in texts] + [Finished("stop", 3, len(texts), 1.5, 2.0, 0.5, "n" * 64, 1)]
    data = b"".join(event_frame(ev) for ev in events)
    for chunk in (len(data) + len(junk), 1):
        decoder = EventStreamDecoder()
        got: list[Any] = []
        stream = data + junk
        try:
            for i in range(0, len(stream), chunk):
                decoder.receive_data(stream[i : i + chunk])
                while (ev := decoder.next_event()) is not None:
                    got.append(ev)
        except RemoteError:
            pass
        assert got[: len(events)] == events


@pytest.mark.parametrize("status", [200, 204, 302, 399])
def test_a_remote_error_claiming_success_becomes_502(status: int) -> None:
    with pytest.raises(MalformedRemoteEvent) as info:
        event_from_wire({"type": "error", "message": "all good, honest", "code": "ok", "status": status})
    err = info.value
    assert err.status == 502 and err.code == "bad_status" and "all good, honest" in err.message
    assert err.remote_status == status


@pytest.mark.parametrize("remote, ours", [(429, 503), (503, 503), (400, 502), (404, 502), (500, 502), (504, 502)])
def test_remote_failures_map_to_502_or_503_with_the_remote_message(remote: int, ours: int) -> None:
    with pytest.raises(RemoteError) as info:
        event_from_wire(
            {
                "type": "error",
                "message": "the peer's words",
                "code": "queue_full",
                "status": remote,
                "retryable": True,
                "retry_after": 2,
            }
        )
    err = info.value
    assert (err.status, err.remote_status, err.code, err.message) == (ours, remote, "queue_full", "the peer's words")
    assert err.retryable and err.retry_after == 2.0


def test_a_queue_full_peer_round_trips_as_503_over_the_stream() -> None:
    decoder = EventStreamDecoder()
    decoder.receive_data(event_frame(QueueFull("m", retry_after=3.0)))
    with pytest.raises(RemoteError) as info:
        decoder.next_event()
    assert info.value.status == 503 and info.value.code == "queue_full" and info.value.retry_after == 3.0


@pytest.mark.parametrize(
    "ev",
    [
        {"type": "error", "status": "500"},
        {"type": "error", "status": 700},
        {"type": "error"},
        "error",
        None,
        [],
        {"type": "delta"},
        {"type": "delta", "text": b"bytes"},
        {"type": "finished", "finish_reason": "stop", "prompt_tokens": 1.0, "completion_tokens": 1},
        {"type": "finished", "finish_reason": "", "prompt_tokens": 1, "completion_tokens": 1},
        {"type": "finished", "finish_reason": "stop", "prompt_tokens": -1, "completion_tokens": 1},
        {"type": "finished", "finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1, "ttft_ms": "x"},
    ],
)
def test_malformed_events_are_protocol_errors(ev: Any) -> None:
    with pytest.raises(MalformedRemoteEvent) as info:
        event_from_wire(ev)
    assert info.value.status == 502


def test_stream_frames_with_tags_or_other_ops_are_protocol_errors() -> None:
    tagged = cbor2.dumps({"ev": {"text": cbor2.CBORTag(35, "x"), "type": "delta"}, "op": "event"}, canonical=True)
    for data in (len(tagged).to_bytes(4, "big") + tagged, encode_frame({"op": "hello"}), b"\xff\xff\xff\xff"):
        decoder = EventStreamDecoder()
        decoder.receive_data(data)
        with pytest.raises(MalformedRemoteEvent) as info:
            decoder.next_event()
        assert info.value.status == 502


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "model",
                "kind",
                "messages",
                "prompt",
                "max_tokens",
                "temperature",
                "top_p",
                "stop",
                "seed",
                "request_id",
                "session",
            ]
        ),
        values,
        max_size=8,
    )
    | values
)
def test_a_peers_generation_request_is_a_request_or_invalid_request(d: Any) -> None:
    try:
        req = GenerationRequest.from_wire(d)
    except InvalidRequest:
        return
    assert GenerationRequest.from_wire(req.to_wire()) == req


# ---- runner channel (the node's own child) -----------------------------------------------


@settings(max_examples=300)
@given(
    st.builds(
        lambda op, rest: {**rest, "op": op},
        st.sampled_from(["delta", "done", "error", "pong"]),
        st.dictionaries(st.sampled_from(EVENT_KEYS + ["speculative"]), leaves, max_size=8),
    )
)
def test_runner_answers_give_an_event_or_a_generation_error(msg: dict) -> None:
    try:
        ev = runner_event_from_wire(msg, queue_wait_ms=1.0, served_by="me")
    except GenerationError as exc:
        assert 400 <= exc.status <= 599
    else:
        assert isinstance(ev, (TextDelta, Finished))


def test_runner_errors_keep_their_status_and_bad_answers_are_502() -> None:
    with pytest.raises(GenerationError) as info:
        runner_event_from_wire(
            {"op": "error", "id": 1, "code": "context_length_exceeded", "status": 400, "message": "too long"},
            queue_wait_ms=0,
            served_by="me",
        )
    assert (info.value.status, info.value.code) == (400, "context_length_exceeded")
    with pytest.raises(MalformedRemoteEvent) as info:
        runner_event_from_wire({"op": "error", "id": 1, "status": 200}, queue_wait_ms=0, served_by="me")
    assert info.value.status == 502 and info.value.code == "bad_status"
    with pytest.raises(RunnerProtocolError) as info:
        runner_event_from_wire({"op": "done", "id": 1, "finish_reason": "stop"}, queue_wait_ms=0, served_by="me")
    assert info.value.status == 502 and info.value.code == "bad_runner_message"
    fin = runner_event_from_wire(
        {"op": "done", "id": 1, "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 2},
        queue_wait_ms=4.0,
        served_by="me",
    )
    assert fin == Finished("stop", 3, 2, 4.0, 0.0, 0.0, "me", 0)


def test_runner_channel_ids_must_be_request_ids() -> None:
    for bad in (-1, "1", 2**64 - 1, 1.0, [1]):
        d = FrameDecoder()
        d.receive_data(encode_frame({"op": "delta", "id": bad, "text": "x"}))
        with pytest.raises(ChannelError) as info:
            d.next_message()
        assert info.value.code == "bad_message"


def test_huge_seeds_stay_inside_the_data_model_with_the_same_low_bits() -> None:
    req = GenerationRequest(model="m", kind="completion", prompt="x", seed=10**30)
    assert req.seed & 0xFFFFFFFF == 10**30 & 0xFFFFFFFF
    assert encode_frame({"op": "generate", "id": 1, "req": req.to_wire()})
    assert GenerationRequest.from_wire(req.to_wire()) == req


def test_delta_tokens_and_resume_fields_round_trip_and_are_checked() -> None:
    """A delta's token ids and a continuation's ``resume_tokens`` / ``resume_skip`` cross the wire
    unchanged, are left out when empty (a plain request or delta looks as it always did), and
    anything else is refused with a typed error."""
    delta = TextDelta("Hi", tokens=(17, 4))
    assert event_from_wire(cbor2.loads(cbor2.dumps(delta.to_wire()))) == delta
    assert "tokens" not in TextDelta("Hi").to_wire()
    req = GenerationRequest("m", "completion", prompt="p", resume_tokens=(5, 6, 7), resume_skip=3)
    assert GenerationRequest.from_wire(cbor2.loads(cbor2.dumps(req.to_wire()))) == req
    plain = GenerationRequest("m", "completion", prompt="p").to_wire()
    assert "resume_tokens" not in plain and "resume_skip" not in plain
    for bad in ({"type": "delta", "text": "", "tokens": [-1]}, {"type": "delta", "text": "", "tokens": "x"}):
        with pytest.raises(MalformedRemoteEvent):
            event_from_wire(bad)
    for wire in ({"resume_tokens": [2**31]}, {"resume_skip": 2}, {"resume_tokens": [1], "resume_skip": -1}):
        with pytest.raises(InvalidRequest):
            GenerationRequest.from_wire({"model": "m", "kind": "completion", "prompt": "p", **wire})
