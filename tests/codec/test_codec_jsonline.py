"""codec.jsonline: a child's JSON line gives an object or a DecodeError, whatever the bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.jsonline import MAX_JSON_DEPTH, decode_object_line


@settings(max_examples=400)
@given(st.binary(max_size=200))
def test_any_bytes_give_an_object_or_a_decode_error(line: bytes) -> None:
    try:
        assert isinstance(decode_object_line(line, max_bytes=150), dict)
    except DecodeError as exc:
        assert exc.code


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5) | st.none(), max_size=5))
def test_objects_round_trip(d: dict) -> None:
    assert decode_object_line(json.dumps(d).encode() + b"\n", max_bytes=10_000) == d


@pytest.mark.parametrize(
    "line, code",
    [
        (b'{"a": 1, "a": 2}', "duplicate_key"),
        (b'{"a": NaN}', "non_finite_float"),
        (b'{"a": Infinity}', "non_finite_float"),
        (b"[1]", "not_an_object"),
        (b"\xff{}", "invalid_utf8"),
        (b"{}\n{}", "trailing_bytes"),
        (b"{" + b" " * 100 + b"}", "too_large"),
        (b'{"a":' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}", "too_deep"),
        (b'{"a": "[[[[[[[[[[[[[["}', None),
        (b"[" * 60, "too_deep"),
    ],
)
def test_explicit_cases(line: bytes, code: str | None) -> None:
    if code is None:
        assert decode_object_line(line, max_bytes=100) == {"a": "[" * 14}
        return
    with pytest.raises(DecodeError) as info:
        decode_object_line(line, max_bytes=100)
    assert info.value.code == code
