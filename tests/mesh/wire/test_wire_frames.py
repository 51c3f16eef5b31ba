"""Plaintext frames and the encrypted channel: typed round trips, and typed rejection of anything bad."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.mesh.wire.secure_channel import SecureChannel
from hydra_node.mesh.wire.constants import DATA_CHUNK_BYTES, MAX_LINK_FRAME_BYTES
from hydra_node.mesh.wire.errors import FrameRejected, LocalProtocolError
from hydra_node.mesh.wire.frames import (
    Close,
    Data,
    GoAway,
    Message,
    Open,
    LinkPing,
    LinkPong,
    Reset,
    Window,
    decode_frame,
    encode_frame,
)

stream_ids = st.integers(1, 2**32 - 1)
reasons = st.text(max_size=50)
frames = st.one_of(
    st.builds(
        Open, stream_ids, st.dictionaries(st.text(max_size=8), st.integers(0, 99) | st.text(max_size=8), max_size=4)
    ),
    st.builds(Data, stream_ids, st.binary(min_size=1, max_size=300)),
    st.builds(Close, stream_ids),
    st.builds(Reset, stream_ids, st.text(min_size=1, max_size=20), reasons),
    st.builds(Window, stream_ids, st.integers(1, 2**31 - 1)),
    st.builds(Message, st.dictionaries(st.text(max_size=8), st.integers(0, 99), max_size=4)),
    st.builds(LinkPing, st.binary(min_size=8, max_size=8)),
    st.builds(LinkPong, st.binary(min_size=8, max_size=8)),
    st.builds(GoAway, st.text(min_size=1, max_size=20), reasons),
)


@given(frames)
def test_frame_round_trip(frame: object) -> None:
    assert decode_frame(encode_frame(frame)) == frame


@settings(max_examples=400)
@given(st.binary(max_size=64))
def test_random_plaintext_gives_a_frame_or_frame_rejected(data: bytes) -> None:
    try:
        frame = decode_frame(data)
    except FrameRejected as exc:
        assert exc.code in {"bad_frame", "bad_cbor"}
    else:
        assert encode_frame(frame) == data


def test_frames_validate_on_construction() -> None:
    with pytest.raises(LocalProtocolError):
        Data(1, b"x" * (DATA_CHUNK_BYTES + 1))
    with pytest.raises(LocalProtocolError):
        Data(0, b"x")
    with pytest.raises(LocalProtocolError):
        Window(1, 0)
    with pytest.raises(LocalProtocolError):
        LinkPing(b"short")


def _pair() -> tuple[SecureChannel, SecureChannel]:
    a_to_b, b_to_a = bytes([1]) * 32, bytes([2]) * 32
    return SecureChannel(a_to_b, b_to_a), SecureChannel(b_to_a, a_to_b)


@given(st.lists(st.binary(max_size=100), max_size=10))
def test_channel_round_trip_in_order(plaintexts: list[bytes]) -> None:
    a, b = _pair()
    assert [b.open(a.seal(p)) for p in plaintexts] == plaintexts


def test_channel_rejects_tamper_replay_reorder_oversize() -> None:
    a, b = _pair()
    first, second, third = a.seal(b"one"), a.seal(b"two"), a.seal(b"three")
    assert b.open(first) == b"one"
    for bad, code in [
        (first, "replay"),
        (third, "reorder"),
        (second[:-1] + bytes([second[-1] ^ 0x80]), "tamper"),
        (second[:8] + bytes([second[8] ^ 1]) + second[9:], "tamper"),
        (b"\x00" * 10, "bad_frame"),
        (b"\x00" * (MAX_LINK_FRAME_BYTES + 1), "oversize"),
    ]:
        with pytest.raises(FrameRejected) as info:
            b.open(bad)
        assert info.value.code == code
    assert b.open(second) == b"two"  # rejected frames do not advance the counter
    assert b.open(third) == b"three"


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_wire_bytes_are_rejected_with_a_code(data: bytes) -> None:
    _, b = _pair()
    with pytest.raises(FrameRejected) as info:
        b.open(data)
    assert info.value.code in {"bad_frame", "reorder", "tamper"}


def test_seal_refuses_oversize_plaintext() -> None:
    a, _ = _pair()
    with pytest.raises(LocalProtocolError):
        a.seal(b"x" * MAX_LINK_FRAME_BYTES)
