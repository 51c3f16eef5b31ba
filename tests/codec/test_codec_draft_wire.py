"""The draft protocol's decoding: any bytes or maps give a message / parsed value or a WireError."""

from __future__ import annotations

import json
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.runtime.child.speculative.sampling import SamplingParams
from hydra_node.runtime.speculative.wire import (
    MAX_DRAFT_FRAME_BYTES,
    BoundedFrameDecoder,
    DraftHello,
    DraftReady,
    WireError,
    frame,
    parse_hello,
    parse_proposal,
    parse_ready_line,
    parse_start,
    start_message,
)

leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
fields = st.lists(st.integers(-2, 40) | leaves, max_size=5) | leaves
KEYS = [
    "tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "dists",
    "seconds",
    "catchup",
    "code",
    "message",
    "k",
    "proto",
    "model",
    "n_vocab",
    "vocab",
    "n_ctx",
    "max_k",
]
maps = st.builds(
    lambda op, rest: {**rest, "op": op},
    st.sampled_from(["start", "proposal", "error", "hello", "x"]),
    st.dictionaries(st.sampled_from(KEYS), fields, max_size=6),
)


@settings(max_examples=300)
@given(st.binary(max_size=200), st.sampled_from([None, 1]))
def test_draft_frames_from_any_bytes(data: bytes, chunk: int | None) -> None:
    decoder = BoundedFrameDecoder()
    pieces = [data] if chunk is None else [data[i : i + 1] for i in range(len(data))]
    try:
        for piece in pieces:
            decoder.receive_data(piece)
            while (msg := decoder.next_message()) is not None:
                assert isinstance(msg["op"], str)
    except WireError as exc:
        assert exc.code in ("bad_frame", "too_large")


@settings(max_examples=300)
@given(maps, st.booleans())
def test_parsers_on_any_map(msg: dict[str, Any], sampled: bool) -> None:
    try:
        parse_start(msg, n_vocab=32, n_ctx=64)
    except WireError:
        pass
    try:
        parse_proposal(msg, k=4, n_vocab=32, sampled=sampled)
    except WireError:
        pass
    try:
        assert isinstance(parse_hello(msg), DraftHello)
    except WireError as exc:
        assert exc.code in ("refused", "bad_proto", "bad_hello", "bad_request")


def test_hello() -> None:
    hello = {"op": "hello", "proto": 1, "model": "d", "n_vocab": 10, "vocab": "ab", "n_ctx": 64, "max_k": 8}
    assert parse_hello(hello) == DraftHello("d", 10, "ab", 64, 8)
    with pytest.raises(WireError) as info:
        parse_hello({"op": "error", "code": "busy", "message": "later"})
    assert info.value.code == "refused"
    with pytest.raises(WireError) as info:
        parse_hello({**hello, "proto": 2})
    assert info.value.code == "bad_proto"


@given(st.lists(st.integers(0, 31), min_size=1, max_size=20), st.binary(max_size=20))
def test_start_survives_any_chunking_and_trailing_junk(tokens: list[int], junk: bytes) -> None:
    data = frame(start_message(tokens, SamplingParams(temperature=0.7, top_p=0.9, top_k=5), 7))
    for chunk in (1, len(data) + len(junk)):
        decoder = BoundedFrameDecoder()
        stream, got = data + junk, []
        try:
            for i in range(0, len(stream), chunk):
                decoder.receive_data(stream[i : i + chunk])
                while (msg := decoder.next_message()) is not None:
                    got.append(msg)
        except WireError:
            pass
        assert parse_start(got[0], 32, 64) == (tokens, SamplingParams(temperature=0.7, top_p=0.9, top_k=5), 7)


def test_tagged_and_oversized_draft_frames_are_wire_errors() -> None:
    body = cbor2.dumps({"op": "start", "tokens": cbor2.CBORTag(258, [1, 2])}, canonical=True)
    decoder = BoundedFrameDecoder()
    decoder.receive_data(len(body).to_bytes(4, "big") + body)
    with pytest.raises(WireError) as info:
        decoder.next_message()
    assert info.value.code == "bad_frame" and "tag" in str(info.value).lower()
    decoder = BoundedFrameDecoder()
    decoder.receive_data((MAX_DRAFT_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(WireError) as info:
        decoder.next_message()
    assert info.value.code == "too_large"


@settings(max_examples=200)
@given(
    st.binary(max_size=120)
    | st.dictionaries(st.sampled_from(["event", "port", "model", "n_vocab", "vocab"]), leaves, max_size=5).map(
        lambda d: json.dumps(d).encode()
    )
)
def test_ready_line_on_any_bytes(line: bytes) -> None:
    try:
        assert isinstance(parse_ready_line(line), DraftReady)
    except WireError as exc:
        assert exc.code == "bad_ready"


def test_ready_line() -> None:
    line = json.dumps({"event": "ready", "port": 4242, "model": "d", "n_vocab": 100, "vocab": "ab"}).encode() + b"\n"
    assert parse_ready_line(line) == DraftReady(4242, "d", 100, "ab")
    with pytest.raises(WireError):
        parse_ready_line(b'{"event": "ready", "port": 1, "port": 2, "model": "d", "n_vocab": 1, "vocab": ""}')
