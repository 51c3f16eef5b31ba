"""codec.cbor: the one strict CBOR decoder — any bytes give a value or a DecodeError."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.codec import cbor
from hydra_node.codec.errors import DecodeError, EncodeError

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=20)
    | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_canonical_value_or_a_decode_error(data: bytes) -> None:
    try:
        value = cbor.decode(data)
    except DecodeError as exc:
        assert exc.code and exc.message
    else:
        assert cbor.encode(value) == data


@given(values)
def test_round_trip_and_whole_prefix_junk(value: object) -> None:
    data = cbor.encode(value)
    assert cbor.decode(data) == value
    with pytest.raises(DecodeError) as info:
        cbor.decode(data + b"\x01")
    assert info.value.code == "trailing_bytes"
    if len(data) > 1:
        with pytest.raises(DecodeError) as info:
            cbor.decode(data[:-1])
        assert info.value.code in ("truncated", "non_canonical")


@pytest.mark.parametrize(
    "value, what",
    [
        (cbor2.CBORTag(35, "^a.*$"), "tag 35 would build a regex object"),
        (cbor2.CBORTag(258, [1, 2]), "tag 258 would build a set"),
        (cbor2.CBORTag(1, 1_700_000_000), "tag 1 would build a datetime"),
        (cbor2.CBORTag(2, b"\x01" + bytes(8)), "tag 2 is a bignum"),
    ],
)
def test_every_tag_is_refused(value: object, what: str) -> None:
    for data in (cbor2.dumps(value), cbor2.dumps({"op": "x", "v": value}, canonical=True), cbor2.dumps([[value]])):
        with pytest.raises(DecodeError) as info:
            cbor.decode(data)
        assert info.value.code == "tag", what


def test_a_set_encoded_by_cbor2_is_refused() -> None:
    with pytest.raises(DecodeError) as info:
        cbor.decode(cbor2.dumps({1, 2}))
    assert info.value.code == "tag"


@pytest.mark.parametrize(
    "data, code",
    [
        (b"\x81" * (cbor.MAX_DEPTH + 1) + b"\x00", "too_deep"),
        (b"\xa2\x61a\x01\x61a\x02", "duplicate_key"),
        (b"\xa2\x61b\x01\x61a\x02", "unsorted_keys"),
        (b"\x18\x01", "non_shortest"),
        (b"\xfb\x3f\xf0\x00\x00\x00\x00\x00\x00", "non_canonical"),
        (b"\x9f\x01\xff", "indefinite_length"),
        (b"\xf9\x7e\x00", "non_finite_float"),
        (b"\xf7", "bad_simple"),
        (b"\xa1\x01\x02", "non_text_key"),
    ],
)
def test_explicit_refusals(data: bytes, code: str) -> None:
    with pytest.raises(DecodeError) as info:
        cbor.decode(data)
    assert info.value.code == code


def test_size_and_depth_limits_are_the_callers() -> None:
    with pytest.raises(DecodeError) as info:
        cbor.decode(cbor.encode(b"x" * 100), max_size=50)
    assert info.value.code == "too_large"
    assert cbor.decode(b"\x81\x81\x00", max_depth=2) == [[0]]
    with pytest.raises(DecodeError) as info:
        cbor.decode(b"\x81\x81\x81\x00", max_depth=2)
    assert info.value.code == "too_deep"
    with pytest.raises(DecodeError) as info:
        cbor.decode("not bytes")  # type: ignore[arg-type]
    assert info.value.code == "malformed"


@pytest.mark.parametrize("value", [{1: 2}, float("nan"), 2**64, {1, 2}, object(), cbor2.CBORTag(1, 1)])
def test_encoder_refuses_values_outside_the_model(value: object) -> None:
    with pytest.raises(EncodeError):
        cbor.encode(value)


def test_mesh_module_is_the_same_codec_with_mesh_errors() -> None:
    from hydra_node.mesh.wire import cbor as mesh_cbor
    from hydra_node.mesh.wire.errors import CborError, LocalProtocolError

    assert mesh_cbor.encode({"b": 1, "a": [1.5]}) == cbor.encode({"b": 1, "a": [1.5]})
    with pytest.raises(CborError) as info:
        mesh_cbor.decode(cbor2.dumps(cbor2.CBORTag(35, "x")))
    assert info.value.code == "tag"
    with pytest.raises(LocalProtocolError):
        mesh_cbor.encode({1: 1})
