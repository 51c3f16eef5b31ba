"""Length-prefixed frames of canonical CBOR maps (sans-IO).

A frame is a 4-byte big-endian length, then that many bytes: one canonical CBOR map
(`codec.cbor`) with a text ``"op"`` naming the message. Every stream protocol of the
node that is not a mesh link frame uses it: the runner channel (node <-> model runner),
remote generate streams, the draft protocol and the RPC tunnel's control messages.
Each of those names its own bound on a frame (a `limit`); a frame announcing more is
refused as soon as its length is in, before its body is buffered.

`MessageDecoder` takes bytes in any chunking (`receive_data`) and hands out whole
messages (`next_message`, None while more is needed). Whatever the bytes, it returns a
message or raises `DecodeError` (`FrameError` for framing defects, a CBOR `DecodeError`
for a bad body); once it has raised, the stream is broken and the caller must close it.
Bytes after the last frame a protocol expects (a tunnel's raw payload) are handed back
by `take_unconsumed`.
"""

from __future__ import annotations

import struct
from typing import Any

from hydra_node.codec import cbor
from hydra_node.codec.errors import DecodeError, EncodeError, FrameError

__all__ = ["HEADER_BYTES", "MAX_MESSAGE_DEPTH", "MAX_OP_CHARS", "MessageDecoder", "encode_message"]

HEADER_BYTES = 4
"""Size of the big-endian length that precedes every frame."""
MAX_MESSAGE_DEPTH = 8
"""Deepest nesting inside one message (a draft proposal's distributions nest 4 deep)."""
MAX_OP_CHARS = 32
"""Longest ``op`` name (ours are at most 13 characters)."""

_HEADER = struct.Struct(">I")


def encode_message(msg: dict[str, Any], *, limit: int) -> bytes:
    """One frame carrying `msg` (a map with a text ``op``); EncodeError above `limit` bytes."""
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise EncodeError("a framed message is a map with a text 'op'")
    body = cbor.encode(msg)
    if len(body) > limit:
        raise EncodeError(f"frame of {len(body)} bytes exceeds the {limit}-byte limit", code="too_large")
    return _HEADER.pack(len(body)) + body


class MessageDecoder:
    """Bytes in (`receive_data`), whole messages out (`next_message`)."""

    def __init__(self, limit: int, *, max_depth: int = MAX_MESSAGE_DEPTH) -> None:
        if limit <= 0:
            raise ValueError("a frame limit is positive")
        self.limit = limit
        self.max_depth = max_depth
        self._buf = bytearray()
        self._broken: DecodeError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out."""
        return len(self._buf)

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The next frame's body (not decoded), or None until it is complete."""
        if self._broken is not None:
            raise self._broken
        if len(self._buf) < HEADER_BYTES:
            return None
        (n,) = _HEADER.unpack_from(self._buf)
        if n > self.limit:
            self._broken = FrameError(f"frame of {n} bytes exceeds the {self.limit}-byte limit", code="too_large")
            raise self._broken
        if len(self._buf) < HEADER_BYTES + n:
            return None
        body = bytes(self._buf[HEADER_BYTES : HEADER_BYTES + n])
        del self._buf[: HEADER_BYTES + n]
        return body

    def next_message(self) -> dict[str, Any] | None:
        """The next message (a map with a text ``op``), or None until it is complete."""
        body = self.next_frame()
        if body is None:
            return None
        try:
            msg = cbor.decode(body, max_size=self.limit, max_depth=self.max_depth)
            if not isinstance(msg, dict) or not isinstance(msg.get("op"), str) or len(msg["op"]) > MAX_OP_CHARS:
                raise FrameError(
                    f"a frame must carry a map with a text 'op' of at most {MAX_OP_CHARS} characters",
                    code="bad_message",
                )
            self.check(msg)
        except DecodeError as exc:
            self._broken = exc
            raise
        return msg

    def check(self, msg: dict[str, Any]) -> None:
        """Protocol-wide checks of a decoded message; subclasses raise FrameError."""

    def take_unconsumed(self) -> bytes:
        """Everything received after the last frame handed out (the decoder is then empty)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest
