"""codec.framing: whole, byte by byte and with trailing junk, any bytes give messages or a DecodeError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.codec.errors import DecodeError, EncodeError, FrameError
from hydra_node.codec.framing import MessageDecoder, encode_message
from vector_json import from_json

LIMIT = 4096
VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"

leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=10)
    | st.text(max_size=10)
)
messages = st.builds(
    lambda op, rest: {**rest, "op": op},
    st.text(min_size=1, max_size=12),
    st.dictionaries(st.text(max_size=5), st.lists(leaves, max_size=3) | leaves, max_size=4),
)


def _drain(decoder: MessageDecoder, out: list[dict[str, Any]]) -> None:
    while (msg := decoder.next_message()) is not None:
        out.append(msg)


def feed(data: bytes, chunk: int | None) -> tuple[list[dict[str, Any]], DecodeError | None]:
    """Messages decoded from `data` fed in `chunk`-byte pieces (None: whole), and the error if any."""
    decoder = MessageDecoder(LIMIT)
    got: list[dict[str, Any]] = []
    pieces = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    try:
        for piece in pieces:
            decoder.receive_data(piece)
            _drain(decoder, got)
    except DecodeError as exc:
        return got, exc
    return got, None


@given(st.lists(messages, max_size=5))
def test_whole_and_byte_by_byte_give_the_same_messages(msgs: list[dict[str, Any]]) -> None:
    data = b"".join(encode_message(m, limit=LIMIT) for m in msgs)
    assert feed(data, None) == (msgs, None)
    assert feed(data, 1) == (msgs, None)


@given(st.lists(messages, min_size=1, max_size=3), st.binary(min_size=1, max_size=40))
def test_trailing_junk_never_corrupts_earlier_messages(msgs: list[dict[str, Any]], junk: bytes) -> None:
    data = b"".join(encode_message(m, limit=LIMIT) for m in msgs)
    for chunk in (None, 1, 7):
        got, err = feed(data + junk, chunk)
        assert got[: len(msgs)] == msgs
        assert err is None or isinstance(err, DecodeError)


@settings(max_examples=500)
@given(st.binary(max_size=300), st.sampled_from([None, 1, 3]))
def test_any_bytes_give_messages_or_a_decode_error(data: bytes, chunk: int | None) -> None:
    got, err = feed(data, chunk)
    for msg in got:
        assert isinstance(msg, dict) and isinstance(msg["op"], str)
    if err is not None:
        assert err.code


def test_oversized_frame_is_refused_before_its_body_and_the_decoder_stays_broken() -> None:
    decoder = MessageDecoder(10)
    decoder.receive_data((11).to_bytes(4, "big"))
    with pytest.raises(FrameError) as info:
        decoder.next_message()
    assert info.value.code == "too_large"
    decoder.receive_data(encode_message({"op": "x"}, limit=10))
    with pytest.raises(FrameError):  # a broken stream stays broken
        decoder.next_message()


def test_encoder_bounds_and_shape() -> None:
    with pytest.raises(EncodeError):
        encode_message({"op": "x", "pad": "y" * 20}, limit=10)
    with pytest.raises(EncodeError):
        encode_message({"no": "op"}, limit=100)
    with pytest.raises(EncodeError):
        encode_message({"op": "x", "bad": float("inf")}, limit=100)


def test_unconsumed_bytes_are_handed_back() -> None:
    decoder = MessageDecoder(LIMIT)
    decoder.receive_data(encode_message({"op": "path"}, limit=LIMIT) + b"raw rpc bytes")
    assert decoder.next_message() == {"op": "path"}
    assert decoder.take_unconsumed() == b"raw rpc bytes" and decoder.buffered == 0


FRAMING = json.loads((VECTORS / "framing.json").read_text())


@pytest.mark.parametrize("vector", FRAMING["valid"], ids=lambda v: v["name"])
def test_framing_vectors_valid(vector: dict[str, Any]) -> None:
    limit = FRAMING["limit"]
    msg = from_json(vector["decoded"])
    assert encode_message(msg, limit=limit).hex() == vector["hex"]
    for chunk in (None, 1):
        assert feed(bytes.fromhex(vector["hex"]), chunk) == ([msg], None)


@pytest.mark.parametrize("vector", FRAMING["invalid"], ids=lambda v: v["name"])
def test_framing_vectors_invalid(vector: dict[str, Any]) -> None:
    decoder = MessageDecoder(FRAMING["limit"])
    decoder.receive_data(bytes.fromhex(vector["hex"]))
    if vector["error"] is None:
        assert decoder.next_message() is None
        return
    with pytest.raises(DecodeError) as info:
        decoder.next_message()
    assert info.value.code == vector["error"]
