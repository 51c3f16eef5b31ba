"""Canonical CBOR of a restricted data model (sans-IO).

Data model: unsigned and negative integers (-2**64 .. 2**64-1), byte strings,
UTF-8 text strings, arrays, maps whose keys are text strings, false, true,
null and finite floats. No tags, no undefined, no other simple values, no
indefinite lengths.

Encoding follows RFC 8949 section 4.2.1 (core deterministic encoding): shortest
integer and length heads, shortest float that keeps the value, map keys sorted
bytewise by their encoded form, no duplicates. Because every key is a text
string, bytewise order of encoded keys equals cbor2's length-first canonical
order, so `cbor2.dumps(obj, canonical=True)` is the encoder.

This is the one decoder of bytes that come from outside the process (peers and
children); every wire format of the node builds on it (see `codec.framing`).

`decode` is strict. Fast path (every valid input): cbor2 decodes (it bounds
nesting and reads claimed lengths in chunks, so a lying head costs nothing),
a walk over the decoded value checks it is inside the data model (types, text
keys, integer range, finite floats, depth), and the value is re-encoded and must
equal the input byte for byte, which rejects every non-canonical form (long
heads, indefinite lengths, unsorted or duplicate keys, tags that decode to
model values, trailing bytes, non-shortest floats). Only input that fails takes
the slow path: a structural scan (iterative, bounded depth) over the heads that
names the defect in `DecodeError.code`. Valid input costs two C passes and one
walk over the values instead of a Python loop over every head (about 6x less).
"""

from __future__ import annotations

import math
from typing import Any

import cbor2

from hydra_node.codec.errors import DecodeError, EncodeError

__all__ = ["DEFAULT_MAX_SIZE", "MAX_DEPTH", "decode", "encode"]

MAX_DEPTH = 16
"""Deepest nesting of arrays/maps accepted (our messages nest at most 5 deep)."""

DEFAULT_MAX_SIZE = 8 * 1024 * 1024
"""Largest encoded value decoded by default: a mesh link's maximum frame size (8 MiB)."""

_INT_MIN = -(2**64)
_INT_MAX = 2**64 - 1
_SHORTEST_MIN = {24: 24, 25: 0x100, 26: 0x10000, 27: 0x100000000}


def encode(value: Any) -> bytes:
    """Canonical bytes of `value`; EncodeError (our bug) if it is outside the data model."""
    _check_model(value, 0)
    return cbor2.dumps(value, canonical=True)


def decode(data: bytes, *, max_size: int = DEFAULT_MAX_SIZE, max_depth: int = MAX_DEPTH) -> Any:
    """Decode canonical bytes, or raise DecodeError whose `code` names the defect.

    Never raises anything else, whatever `data` holds."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError("CBOR input must be bytes", code="malformed")
    data = bytes(data)
    if len(data) > max_size:
        raise DecodeError(f"CBOR value of {len(data)} bytes exceeds the limit of {max_size}", code="too_large")
    try:
        value = cbor2.loads(data)
        if _in_model(value, max_depth) and cbor2.dumps(value, canonical=True) == data:
            return value
    except Exception:  # noqa: BLE001 - anything odd: the slow path below names the defect
        pass
    return _decode_slowly(data, max_depth)


def _in_model(value: Any, max_depth: int) -> bool:
    """Whether the decoded `value` is inside the data model (its encoding is checked apart).

    Walked level by level, so depth is counted once per level rather than carried by every item."""
    level = [value]
    depth = 0
    while True:
        containers: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is str or kind is bytes or kind is bool or item is None:
                continue
            if kind is int:
                if not _INT_MIN <= item <= _INT_MAX:
                    return False
            elif kind is float:
                if not math.isfinite(item):
                    return False
            elif kind is list:
                containers.append(item)
            elif kind is dict:
                for key in item:
                    if type(key) is not str:
                        return False
                containers.append(item.values())
            else:
                return False
        if not containers:
            return True
        depth += 1
        if depth > max_depth:
            return False
        level = [child for container in containers for child in container]


def _decode_slowly(data: bytes, max_depth: int) -> Any:
    """The strict path for input the fast path refused: DecodeError with the defect's code."""
    _scan(data, max_depth)
    try:
        value = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, OverflowError, RecursionError) as exc:
        raise DecodeError(f"undecodable CBOR: {exc}", code="malformed") from None
    _check_decoded_floats(value)
    try:
        again = cbor2.dumps(value, canonical=True)
    except (cbor2.CBOREncodeError, ValueError, OverflowError) as exc:  # pragma: no cover - scan prevents this
        raise DecodeError(f"value outside the data model: {exc}", code="non_canonical") from None
    if again != data:
        raise DecodeError("CBOR is not in canonical form (e.g. a float not in its shortest form)", code="non_canonical")
    return value


def _fail(code: str, message: str) -> DecodeError:
    return DecodeError(message, code=code)


def _scan(data: bytes, max_depth: int) -> None:
    """Walk the heads of `data` iteratively and enforce the canonical rules."""
    n = len(data)
    pos = 0
    # each frame: [items left, is_map, previous encoded key]
    stack: list[list[Any]] = []
    while True:
        if pos >= n:
            raise _fail("truncated", "CBOR input ends in the middle of a value")
        start = pos
        initial = data[pos]
        pos += 1
        major, info = initial >> 5, initial & 0x1F
        if info < 24:
            value = info
        elif info <= 27:
            size = 1 << (info - 24)
            if pos + size > n:
                raise _fail("truncated", "CBOR input ends inside a head")
            value = int.from_bytes(data[pos : pos + size], "big")
            pos += size
            if major != 7 and value < _SHORTEST_MIN[info]:
                raise _fail("non_shortest", f"integer or length {value} not in its shortest form")
        elif info == 31:
            raise _fail("indefinite_length", "indefinite-length items and break codes are not allowed")
        else:
            raise _fail("reserved", f"reserved additional information {info}")

        is_key = False
        if stack:
            frame = stack[-1]
            is_key = frame[1] and frame[0] % 2 == 0
            frame[0] -= 1
        if is_key and major != 3:
            raise _fail("non_text_key", "map keys must be text strings")

        child: list[Any] | None = None
        if major in (2, 3):
            if value > n - pos:
                raise _fail("truncated", "CBOR string runs past the end of the input")
            if major == 3:
                try:
                    data[pos : pos + value].decode("utf-8")
                except UnicodeDecodeError:
                    raise _fail("invalid_utf8", "text string is not valid UTF-8") from None
            pos += value
        elif major in (4, 5):
            if len(stack) + 1 > max_depth:
                raise _fail("too_deep", f"CBOR nesting deeper than {max_depth}")
            count = value * 2 if major == 5 else value
            if count > n - pos:
                raise _fail("truncated", "CBOR container claims more items than bytes remain")
            if count:
                child = [count, major == 5, None]
        elif major == 6:
            raise _fail("tag", "CBOR tags are not allowed")
        elif major == 7:
            if info < 20 or info in (23, 24):
                raise _fail("bad_simple", "only false, true, null and floats are allowed simple values")

        if is_key:
            key = data[start:pos]
            previous = stack[-1][2]
            if previous is not None:
                if key == previous:
                    raise _fail("duplicate_key", f"duplicate map key {key[1:]!r}")
                if key < previous:
                    raise _fail("unsorted_keys", "map keys are not in bytewise order of their encoding")
            stack[-1][2] = key

        if child is not None:
            stack.append(child)
            continue
        while stack and stack[-1][0] == 0:
            stack.pop()
        if not stack:
            break
    if pos != n:
        raise _fail("trailing_bytes", f"{n - pos} bytes follow the CBOR value")


def _check_decoded_floats(value: Any) -> None:
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise _fail("non_finite_float", "NaN and infinities are not allowed")
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.values())


def _check_model(value: Any, depth: int) -> None:
    if value is None or isinstance(value, (bool, str, bytes)):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise EncodeError(f"integer {value} is outside the CBOR major type 0/1 range")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EncodeError("NaN and infinities cannot be encoded")
        return
    if isinstance(value, (list, tuple, dict)):
        if depth + 1 > MAX_DEPTH:
            raise EncodeError(f"value nests deeper than {MAX_DEPTH}")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise EncodeError(f"map key {key!r} is not a text string")
                _check_model(item, depth + 1)
        else:
            for item in value:
                _check_model(item, depth + 1)
        return
    raise EncodeError(f"type {type(value).__name__} is outside the CBOR data model")
