"""The RPC tunnel's control messages (sans-IO): lease grant, data-connection offer, path choice.

Specified in ``protocol/README.md`` section 11.6, pinned by ``protocol/vectors/lease.json``.
Each is one length-prefixed canonical CBOR map (:mod:`hydra_node.codec.framing`, the one
strict decoder) on a ``tunnel``/``rpc`` mesh stream:

* lease stream, worker node -> coordinator, once:
  ``{"op": "lease_granted", "proto": "7.0.0", "free_bytes": N, "device": text, "data": bool}``
* connect stream with ``"data": 1``, worker node -> coordinator, once:
  ``{"op": "data_offer", "port": P, "ticket": bytes(16), "secret": bytes(32)}`` or
  ``{"op": "no_data_offer"}``
* then coordinator -> worker node, once: ``{"op": "path", "via": "data" | "link"}``; with
  ``link`` the raw ggml RPC bytes follow on the stream (:meth:`ControlDecoder.take_unconsumed`).

Bytes in, typed events out (:class:`ControlDecoder`); events in, bytes out
(:func:`encode_control`). Whatever the bytes, the decoder returns an event or raises
:class:`ControlError` with a stable ``code``: nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Union

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message

from hydra_node.runtime.rpc.proto import ProtoVersion

__all__ = [
    "MAX_CONTROL_FRAME_BYTES",
    "MAX_DEVICE_CHARS",
    "OFFER_SECRET_BYTES",
    "OFFER_TICKET_BYTES",
    "ControlDecoder",
    "ControlError",
    "ControlEvent",
    "DataOffer",
    "LeaseGranted",
    "NoDataOffer",
    "PathChoice",
    "decode_control",
    "encode_control",
]

#: Largest control frame (a lease grant is about 80 bytes; a device name is bounded below).
MAX_CONTROL_FRAME_BYTES = 1024
#: Longest device description in a lease grant.
MAX_DEVICE_CHARS = 256
#: Sizes of a data-connection ticket id and secret (``dataconn.TICKET_BYTES``/``SECRET_BYTES``).
OFFER_TICKET_BYTES = 16
OFFER_SECRET_BYTES = 32
#: Largest worker memory figure (2**53: exact in every JSON reader of the status API).
MAX_FREE_BYTES = 2**53


class ControlError(Exception):
    """A control message broke the tunnel protocol (the remote node's fault).

    Codes: the codec's (``truncated``, ``too_large``, ``tag``, ...), ``bad_message`` (a field
    is missing or out of bounds), ``unexpected`` (a valid message where another was due),
    ``ended`` (the stream ended before the message was complete)."""

    def __init__(self, message: str, *, code: str = "bad_message") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class LeaseGranted:
    proto: ProtoVersion
    free_bytes: int
    device: str
    data: bool  # the worker node takes data connections

    def __post_init__(self) -> None:
        if not 0 <= self.free_bytes <= MAX_FREE_BYTES or len(self.device) > MAX_DEVICE_CHARS:
            raise ValueError("free_bytes or device out of bounds")


@dataclass(frozen=True)
class DataOffer:
    port: int
    ticket: bytes
    secret: bytes

    def __post_init__(self) -> None:
        if (
            not 0 < self.port < 65536
            or len(self.ticket) != OFFER_TICKET_BYTES
            or len(self.secret) != OFFER_SECRET_BYTES
        ):
            raise ValueError("a data offer needs a port, a 16-byte ticket and a 32-byte secret")


@dataclass(frozen=True)
class NoDataOffer:
    pass


@dataclass(frozen=True)
class PathChoice:
    via: Literal["data", "link"]

    def __post_init__(self) -> None:
        if self.via not in ("data", "link"):
            raise ValueError("a path is 'data' or 'link'")


ControlEvent = Union[LeaseGranted, DataOffer, NoDataOffer, PathChoice]


def encode_control(event: ControlEvent) -> bytes:
    """The frame for `event` (events validate themselves when built)."""
    if isinstance(event, LeaseGranted):
        msg: dict[str, Any] = {
            "op": "lease_granted",
            "proto": str(event.proto),
            "free_bytes": event.free_bytes,
            "device": event.device,
            "data": event.data,
        }
    elif isinstance(event, DataOffer):
        msg = {"op": "data_offer", "port": event.port, "ticket": event.ticket, "secret": event.secret}
    elif isinstance(event, NoDataOffer):
        msg = {"op": "no_data_offer"}
    elif isinstance(event, PathChoice):
        msg = {"op": "path", "via": event.via}
    else:
        raise TypeError(f"not a control event: {event!r}")
    return encode_message(msg, limit=MAX_CONTROL_FRAME_BYTES)


def _field(msg: dict, key: str, kind: type) -> Any:
    v = msg.get(key)
    if type(v) is not kind:
        raise ControlError(f"{msg['op']}: {key!r} must be {kind.__name__}, not {v!r:.40}")
    return v


def decode_control(msg: dict[str, Any]) -> ControlEvent:
    """A decoded control map as a typed event; :class:`ControlError` if it is not one."""
    op = msg["op"]
    try:
        if op == "lease_granted":
            try:
                proto = ProtoVersion.parse(_field(msg, "proto", str))
            except ValueError as exc:
                raise ControlError(f"lease_granted: {exc}") from None
            return LeaseGranted(
                proto, _field(msg, "free_bytes", int), _field(msg, "device", str), _field(msg, "data", bool)
            )
        if op == "data_offer":
            return DataOffer(_field(msg, "port", int), _field(msg, "ticket", bytes), _field(msg, "secret", bytes))
        if op == "no_data_offer":
            return NoDataOffer()
        if op == "path":
            return PathChoice(_field(msg, "via", str))
    except ValueError as exc:
        raise ControlError(f"{op}: {exc}") from None
    raise ControlError(f"unknown control message {op!r:.40}", code="unexpected")


class ControlDecoder:
    """Bytes in, one expected control event out; the bytes after it are handed back."""

    def __init__(self) -> None:
        self._frames = MessageDecoder(MAX_CONTROL_FRAME_BYTES, max_depth=1)

    def receive_data(self, data: bytes) -> None:
        self._frames.receive_data(data)

    def next_event(self, *expected: type) -> ControlEvent | None:
        """The next event (one of `expected` when given), or None until it is complete."""
        try:
            msg = self._frames.next_message()
        except DecodeError as exc:
            raise ControlError(f"bad control frame: {exc}", code=exc.code) from None
        if msg is None:
            return None
        event = decode_control(msg)
        if expected and not isinstance(event, expected):
            want = " or ".join(t.__name__ for t in expected)
            raise ControlError(f"expected {want}, got {type(event).__name__}", code="unexpected")
        return event

    def end_of_stream(self) -> None:
        """The stream ended: raise :class:`ControlError` (``ended``) — no event is complete."""
        raise ControlError(
            f"the stream ended with {self._frames.buffered} bytes of an incomplete control message", code="ended"
        )

    def take_unconsumed(self) -> bytes:
        """Bytes received after the last event (a ``link`` path's first RPC bytes)."""
        return self._frames.take_unconsumed()
