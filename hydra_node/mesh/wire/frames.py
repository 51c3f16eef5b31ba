"""Plaintext link frames (inside the encryption), as typed frozen dataclasses (sans-IO).

Layout: ``kind (u8) || stream id (u32 big-endian) || payload``. Stream 0 is the
link itself; streams opened by the connecting side are odd, by the accepting
side even.

====  ========  ======  ============================================
kind  name      stream  payload
====  ========  ======  ============================================
0x01  OPEN      != 0    canonical CBOR map (the stream header)
0x02  DATA      != 0    1..DATA_CHUNK_BYTES raw bytes
0x03  CLOSE     != 0    empty (half-close: sender will send no more)
0x04  RESET     != 0    CBOR {"code": text, "message": text}
0x05  WINDOW    != 0    u32 big-endian credit increment (> 0)
0x06  MESSAGE   0       canonical CBOR map (priority lane, e.g. gossip)
0x07  PING      0       8 opaque bytes
0x08  PONG      0       the 8 bytes of the PING answered
0x09  GOAWAY    0       CBOR {"code": text, "message": text}
====  ========  ======  ============================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.constants import DATA_CHUNK_BYTES, MAX_MESSAGE_BYTES, MAX_OPEN_HEADER_BYTES
from hydra_node.mesh.wire.errors import CborError, FrameRejected, LocalProtocolError

MAX_STREAM_ID = 2**32 - 1
MAX_REASON_CHARS = 1024
MAX_WINDOW = 2**31 - 1


def _check_stream(stream_id: int, link_level: bool) -> None:
    if isinstance(stream_id, bool) or not isinstance(stream_id, int) or not 0 <= stream_id <= MAX_STREAM_ID:
        raise LocalProtocolError(f"bad stream id {stream_id!r}")
    if link_level != (stream_id == 0):
        raise LocalProtocolError(f"stream id {stream_id} not allowed for this frame kind")


def _check_reason(code: str, message: str) -> None:
    if not isinstance(code, str) or not code or len(code) > 64:
        raise LocalProtocolError("reason code must be 1..64 characters")
    if not isinstance(message, str) or len(message) > MAX_REASON_CHARS:
        raise LocalProtocolError(f"reason message must be text of at most {MAX_REASON_CHARS} characters")


@dataclass(frozen=True)
class Open:
    stream_id: int
    header: dict[str, Any]

    def __post_init__(self) -> None:
        _check_stream(self.stream_id, False)
        if not isinstance(self.header, dict) or len(cbor.encode(self.header)) > MAX_OPEN_HEADER_BYTES:
            raise LocalProtocolError(f"stream header must be a map of at most {MAX_OPEN_HEADER_BYTES} bytes")


@dataclass(frozen=True)
class Data:
    stream_id: int
    data: bytes

    def __post_init__(self) -> None:
        _check_stream(self.stream_id, False)
        if not isinstance(self.data, bytes) or not 0 < len(self.data) <= DATA_CHUNK_BYTES:
            raise LocalProtocolError(f"DATA carries 1..{DATA_CHUNK_BYTES} bytes")


@dataclass(frozen=True)
class Close:
    stream_id: int

    def __post_init__(self) -> None:
        _check_stream(self.stream_id, False)


@dataclass(frozen=True)
class Reset:
    stream_id: int
    code: str
    message: str = ""

    def __post_init__(self) -> None:
        _check_stream(self.stream_id, False)
        _check_reason(self.code, self.message)


@dataclass(frozen=True)
class Window:
    stream_id: int
    increment: int

    def __post_init__(self) -> None:
        _check_stream(self.stream_id, False)
        if (
            isinstance(self.increment, bool)
            or not isinstance(self.increment, int)
            or not 0 < self.increment <= MAX_WINDOW
        ):
            raise LocalProtocolError(f"window increment must be 1..{MAX_WINDOW}")


@dataclass(frozen=True)
class Message:
    body: dict[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.body, dict):
            raise LocalProtocolError("a message body is a map")


@dataclass(frozen=True)
class LinkPing:
    """Link keep-alive and RTT probe (the frame; not the membership core's SWIM ``Ping`` message)."""

    opaque: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.opaque, bytes) or len(self.opaque) != 8:
            raise LocalProtocolError("PING carries exactly 8 bytes")


@dataclass(frozen=True)
class LinkPong:
    """The answer to a LinkPing, echoing its opaque bytes."""

    opaque: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.opaque, bytes) or len(self.opaque) != 8:
            raise LocalProtocolError("PONG carries exactly 8 bytes")


@dataclass(frozen=True)
class GoAway:
    code: str
    message: str = ""

    def __post_init__(self) -> None:
        _check_reason(self.code, self.message)


Frame = Open | Data | Close | Reset | Window | Message | LinkPing | LinkPong | GoAway
KIND = {Open: 1, Data: 2, Close: 3, Reset: 4, Window: 5, Message: 6, LinkPing: 7, LinkPong: 8, GoAway: 9}


def encode_frame(frame: Frame) -> bytes:
    kind = KIND[type(frame)]
    stream_id = getattr(frame, "stream_id", 0)
    head = bytes([kind]) + stream_id.to_bytes(4, "big")
    if isinstance(frame, Open):
        return head + cbor.encode(frame.header)
    if isinstance(frame, Data):
        return head + frame.data
    if isinstance(frame, Close):
        return head
    if isinstance(frame, (Reset, GoAway)):
        return head + cbor.encode({"code": frame.code, "message": frame.message})
    if isinstance(frame, Window):
        return head + frame.increment.to_bytes(4, "big")
    if isinstance(frame, Message):
        body = cbor.encode(frame.body)
        if len(body) > MAX_MESSAGE_BYTES:
            raise LocalProtocolError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
        return head + body
    return head + frame.opaque  # LinkPing, LinkPong


def _map(payload: bytes, limit: int, what: str) -> dict[str, Any]:
    try:
        value = cbor.decode(payload, max_size=limit)
    except CborError as exc:
        raise FrameRejected(f"{what} payload is not canonical CBOR ({exc.code}): {exc}", code="bad_cbor") from None
    if not isinstance(value, dict):
        raise FrameRejected(f"{what} payload must be a CBOR map", code="bad_cbor")
    return value


def decode_frame(data: bytes) -> Frame:
    """Parse one plaintext frame, or raise FrameRejected (codes bad_frame, bad_cbor)."""
    if len(data) < 5:
        raise FrameRejected(f"frame of {len(data)} bytes is shorter than its 5-byte header", code="bad_frame")
    kind, stream_id, payload = data[0], int.from_bytes(data[1:5], "big"), bytes(data[5:])
    try:
        if kind == 1:
            return Open(stream_id, _map(payload, MAX_OPEN_HEADER_BYTES, "OPEN"))
        if kind == 2:
            return Data(stream_id, payload)
        if kind == 3:
            if payload:
                raise LocalProtocolError("CLOSE has no payload")
            return Close(stream_id)
        if kind in (4, 9):
            reason = _map(payload, 4 * MAX_REASON_CHARS + 64, "RESET/GOAWAY")
            if set(reason) != {"code", "message"}:
                raise LocalProtocolError("reason must be exactly {code, message}")
            if kind == 4:
                return Reset(stream_id, reason["code"], reason["message"])
            _check_stream(stream_id, True)
            return GoAway(reason["code"], reason["message"])
        if kind == 5:
            if len(payload) != 4:
                raise LocalProtocolError("WINDOW carries a 4-byte increment")
            return Window(stream_id, int.from_bytes(payload, "big"))
        if kind in (6, 7, 8):
            _check_stream(stream_id, True)
            if kind == 6:
                return Message(_map(payload, MAX_MESSAGE_BYTES, "MESSAGE"))
            return LinkPing(payload) if kind == 7 else LinkPong(payload)
    except LocalProtocolError as exc:
        raise FrameRejected(f"invalid frame of kind {kind}: {exc}", code="bad_frame") from None
    raise FrameRejected(f"unknown frame kind {kind}", code="bad_frame")
