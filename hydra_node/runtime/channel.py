"""Runner channel framing (sans-IO): 4-byte big-endian length, then one CBOR map.

Used between the node and its model runner children over a socketpair.  The
decoder takes bytes in any chunking and yields whole messages; oversized or
malformed frames raise :class:`ChannelError` (the peer is our own child, so a
bad frame means the child is broken and gets restarted).
"""

from __future__ import annotations

import struct

import cbor2

#: A frame carries one request or a text delta; prompts are capped at the API's 8 MiB body.
MAX_FRAME_BYTES = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


class ChannelError(Exception):
    """The byte stream is not a valid sequence of frames."""


def encode_frame(msg: dict) -> bytes:
    body = cbor2.dumps(msg)
    if len(body) > MAX_FRAME_BYTES:
        raise ChannelError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Accumulates bytes; :meth:`next_message` returns a dict or None when more is needed."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def next_message(self) -> dict | None:
        if len(self._buf) < _HEADER.size:
            return None
        (n,) = _HEADER.unpack_from(self._buf)
        if n > MAX_FRAME_BYTES:
            raise ChannelError(f"frame of {n} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
        if len(self._buf) < _HEADER.size + n:
            return None
        body = bytes(self._buf[_HEADER.size:_HEADER.size + n])
        del self._buf[:_HEADER.size + n]
        try:
            msg = cbor2.loads(body)
        except Exception as exc:  # cbor2 raises several types for bad input
            raise ChannelError(f"undecodable frame: {exc}") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            raise ChannelError("frame is not a map with an 'op'")
        return msg
