"""The JSON form of protocol test vectors (protocol/README.md §10): a CBOR byte string is
``{"bytes": "<hex>"}``; every other value maps one to one. Shared by the vector tests."""

from __future__ import annotations

from typing import Any

__all__ = ["from_json"]


def from_json(value: Any) -> Any:
    """The value a vector's JSON describes (byte strings back to ``bytes``)."""
    if isinstance(value, dict):
        if set(value) == {"bytes"}:
            return bytes.fromhex(value["bytes"])
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value
