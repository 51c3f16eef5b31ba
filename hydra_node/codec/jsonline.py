"""One JSON object on one line, decoded strictly (sans-IO).

Children announce readiness with one JSON line on stdout (the RPC worker, the draft
server): readable by people and by tests, so it stays JSON, but it is decoded like any
other untrusted bytes. `decode_object_line` returns a dict or raises `DecodeError`:
bounded size and nesting, UTF-8, no duplicate keys, no NaN or infinities, an object at
the top. Nothing else escapes, whatever the bytes.
"""

from __future__ import annotations

import json
from typing import Any

from hydra_node.codec.errors import DecodeError

__all__ = ["MAX_JSON_DEPTH", "decode_object_line"]

MAX_JSON_DEPTH = 8
"""Deepest nesting of arrays/objects in a line (readiness lines are flat)."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DecodeError(f"duplicate key {key[:40]!r}", code="duplicate_key")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise DecodeError(f"{name} is not allowed", code="non_finite_float")


def _check_depth(text: str, max_depth: int) -> None:
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                raise DecodeError(f"JSON nesting deeper than {max_depth}", code="too_deep")
        elif ch in "]}":
            depth -= 1


def decode_object_line(line: bytes, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """The JSON object on `line` (a trailing newline is allowed); DecodeError otherwise."""
    if not isinstance(line, (bytes, bytearray, memoryview)):
        raise DecodeError("a JSON line must be bytes")
    line = bytes(line)
    if len(line) > max_bytes:
        raise DecodeError(f"line of {len(line)} bytes exceeds the {max_bytes}-byte limit", code="too_large")
    if line.endswith(b"\n"):
        line = line[:-1]
    if b"\n" in line:
        raise DecodeError("more than one line", code="trailing_bytes")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError("line is not valid UTF-8", code="invalid_utf8") from None
    _check_depth(text, max_depth)
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except DecodeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"line is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise DecodeError("a JSON line must hold an object", code="not_an_object")
    return value
