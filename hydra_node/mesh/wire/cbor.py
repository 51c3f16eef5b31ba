"""The mesh's view of the one strict codec (:mod:`hydra_node.codec.cbor`).

The codec itself lives in ``codec/cbor.py``; this module only re-exports it and maps
its errors onto the mesh's error types (``DecodeError`` -> :class:`CborError`, a
``RemoteProtocolError``; ``EncodeError`` -> :class:`LocalProtocolError`), with the same
stable codes. When the mesh catches ``codec.DecodeError`` directly, this module goes.
"""

from __future__ import annotations

from typing import Any

from hydra_node.codec import cbor as _codec
from hydra_node.codec.cbor import DEFAULT_MAX_SIZE, MAX_DEPTH
from hydra_node.codec.errors import DecodeError, EncodeError

from hydra_node.mesh.wire.errors import CborError, LocalProtocolError

__all__ = ["DEFAULT_MAX_SIZE", "MAX_DEPTH", "decode", "encode"]


def encode(value: Any) -> bytes:
    """Canonical bytes of `value`; LocalProtocolError if it is outside the data model."""
    try:
        return _codec.encode(value)
    except EncodeError as exc:
        raise LocalProtocolError(exc.message) from None


def decode(data: bytes, *, max_size: int = DEFAULT_MAX_SIZE, max_depth: int = MAX_DEPTH) -> Any:
    """Decode canonical bytes, or raise CborError whose `code` names the defect."""
    try:
        return _codec.decode(data, max_size=max_size, max_depth=max_depth)
    except DecodeError as exc:
        raise CborError(exc.message, code=exc.code) from None
