"""Canonical CBOR codec: round trips, strictness, and untrusted input only ever giving CborError."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.errors import CborError, LocalProtocolError

cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=40)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=25,
)


@given(cbor_values)
def test_round_trip(value: object) -> None:
    data = cbor.encode(value)
    decoded = cbor.decode(data)
    assert decoded == value
    assert cbor.encode(decoded) == data


@given(st.dictionaries(st.text(max_size=30), st.integers(0, 1000), max_size=12))
def test_key_order_is_bytewise_order_of_encoded_keys(mapping: dict[str, int]) -> None:
    data = cbor.encode(mapping)
    keys = [cbor2.dumps(k) for k in cbor2.loads(data)]
    assert keys == sorted(keys)  # RFC 8949 4.2.1 bytewise order == cbor2 length-first for text keys


@settings(max_examples=400)
@given(st.binary(max_size=200))
def test_random_bytes_give_a_value_or_cbor_error(data: bytes) -> None:
    try:
        value = cbor.decode(data)
    except CborError as exc:
        assert exc.code and str(exc)
    else:
        assert cbor.encode(value) == data


@settings(max_examples=60)
@given(cbor_values)
def test_prefixes_are_truncated_and_suffixes_are_trailing(value: object) -> None:
    data = cbor.encode(value)
    for cut in range(len(data)):  # fed byte by byte: every proper prefix is incomplete
        with pytest.raises(CborError) as info:
            cbor.decode(data[:cut])
        assert info.value.code == "truncated"
    with pytest.raises(CborError) as info:
        cbor.decode(data + b"\x00junk")
    assert info.value.code == "trailing_bytes"


def test_depth_and_size_limits() -> None:
    deep = b"\x81" * cbor.MAX_DEPTH + b"\x00"
    assert cbor.decode(deep) is not None
    with pytest.raises(CborError) as info:
        cbor.decode(b"\x81" * 100_000 + b"\x00")
    assert info.value.code == "too_deep"
    with pytest.raises(CborError) as info:
        cbor.decode(cbor.encode(b"x" * 100), max_size=50)
    assert info.value.code == "too_large"


@pytest.mark.parametrize(
    "value", [{1: 2}, {b"k": 1}, float("nan"), float("inf"), 2**64, -(2**64) - 1, {1, 2}, object(), bytearray(b"x")]
)
def test_encoder_refuses_values_outside_the_model(value: object) -> None:
    with pytest.raises(LocalProtocolError):
        cbor.encode(value)


def test_encoder_refuses_too_deep() -> None:
    value: list = []
    for _ in range(cbor.MAX_DEPTH + 1):
        value = [value]
    with pytest.raises(LocalProtocolError):
        cbor.encode(value)
