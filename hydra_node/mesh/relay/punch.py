"""Hole punching's messages and its small decisions (sans-IO): protocol/README.md section 11.7, "Hole punching".

Once a relayed link is up, its two ends try to replace it with a direct TCP connection (DCUtR-style,
TCP simultaneous open). Each end knows its own public IP from the relay (``observed`` in the circuit
set-up: ``connected`` for the dialler, the ``relay_incoming`` header for the target); it binds a
fresh TCP socket and tells the other ``observed IP : that socket's port`` — a port-preserving NAT
(Linux MASQUERADE, most home routers) maps the socket to that same public port. The exchange is a
``hole_punch`` stream on the relayed link itself (so end-to-end encrypted):

* the upgrader (the end that accepted the relayed link) opens it with header
  ``{"kind": "hole_punch", "v": 1, "addr": "IP:PORT"}``;
* the other end answers one frame ``{"op": "punch", "addr": "IP:PORT"}`` (or ``refused``);
* the upgrader measures that round trip, sends ``{"op": "sync"}`` and connects after RTT/2; the
  other end connects as soon as ``sync`` arrives, so both SYNs leave at about the same time.

On success there is one TCP connection both ends think they dialled: the smaller node id acts as
the websocket client and handshake initiator (:func:`websocket_client`), the other as the server.
Frames are length-prefixed canonical CBOR (section 2.1) of at most 1 KiB. Untrusted input yields a
typed value or a :class:`PunchProtocolError`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Mapping

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.mesh.relay.messages import RELAY_VERSION, RelayProtocolError

__all__ = [
    "MAX_PUNCH_FRAME_BYTES",
    "MAX_SYNC_DELAY_S",
    "PUNCH_KIND",
    "PunchAddress",
    "PunchDecoder",
    "PunchProtocolError",
    "encode_punch",
    "format_addr",
    "parse_addr",
    "parse_punch_header",
    "punch_header",
    "sync_delay_s",
    "websocket_client",
]

PUNCH_KIND = "hole_punch"
MAX_PUNCH_FRAME_BYTES = 1024
"""Largest punch frame (an address and a refusal's short message fit easily)."""
MAX_ADDR_CHARS = 64
"""``[IPv6]:port`` is at most 47 characters."""
MAX_TEXT_CHARS = 200
MAX_SYNC_DELAY_S = 2.0
"""Cap on the upgrader's wait after ``sync`` (half a relayed round trip; a longer one is a stalled relay)."""
_OPS = {"punch", "sync", "refused"}


class PunchProtocolError(RelayProtocolError):
    """A peer sent a hole-punch header or frame that breaks the protocol (code bad_punch)."""

    code = "bad_punch"


@dataclass(frozen=True)
class PunchAddress:
    """Where to connect: a unicast IP address (v4 or v6) and a TCP port."""

    host: str
    port: int

    def __post_init__(self) -> None:
        ip = ipaddress.ip_address(self.host)  # ValueError for anything else
        if ip.is_unspecified or ip.is_multicast:
            raise ValueError(f"{self.host} is not a unicast address")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not 1..65535")

    @property
    def family_v6(self) -> bool:
        return ipaddress.ip_address(self.host).version == 6


def format_addr(host: str, port: int) -> str:
    """``1.2.3.4:5`` or ``[::1]:5``."""
    addr = PunchAddress(host, port)
    return f"[{addr.host}]:{addr.port}" if addr.family_v6 else f"{addr.host}:{addr.port}"


def parse_addr(text: Any) -> PunchAddress:
    """An ``IP:PORT`` text (brackets around IPv6) as a :class:`PunchAddress`; PunchProtocolError otherwise."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_ADDR_CHARS:
        raise PunchProtocolError(f"a punch address is a text of 1..{MAX_ADDR_CHARS} characters", code="bad_punch")
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not sep or not port.isdigit() or len(port) > 5 or not _is_ip(host):
        raise PunchProtocolError(f"bad punch address {text!r}: expected IP:PORT", code="bad_punch")
    if (ipaddress.ip_address(host).version == 6) != bracketed:
        raise PunchProtocolError(
            f"bad punch address {text!r}: brackets go around an IPv6 address only", code="bad_punch"
        )
    try:
        return PunchAddress(host, int(port))
    except ValueError as exc:
        raise PunchProtocolError(f"bad punch address {text!r}: {exc}", code="bad_punch") from None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _local_addr(addr: Any) -> None:
    """An address we are about to send: a bad one is our bug (ValueError), not the peer's."""
    try:
        parse_addr(addr)
    except PunchProtocolError as exc:
        raise ValueError(str(exc)) from None


def punch_header(addr: str) -> dict[str, Any]:
    """The header of the upgrader's ``hole_punch`` stream."""
    _local_addr(addr)
    return {"kind": PUNCH_KIND, "v": RELAY_VERSION, "addr": addr}


def parse_punch_header(header: Mapping[str, Any]) -> PunchAddress:
    if header.get("v") != RELAY_VERSION:
        raise PunchProtocolError(f"punch version {header.get('v')!r} is not {RELAY_VERSION}", code="bad_punch")
    return parse_addr(header.get("addr"))


def encode_punch(op: str, **fields: Any) -> bytes:
    """One punch frame: ``punch`` {addr}, ``sync`` {}, ``refused`` {code, message}."""
    if op not in _OPS:
        raise ValueError(f"unknown punch frame {op!r}")
    if op == "punch":
        _local_addr(fields.get("addr"))
    return encode_message({"op": op, **fields}, limit=MAX_PUNCH_FRAME_BYTES)


def _check(msg: Mapping[str, Any], expected: str) -> dict[str, Any]:
    op = msg.get("op")
    if op == "refused" and expected == "punch":
        if (
            not isinstance(msg.get("code"), str)
            or not isinstance(msg.get("message"), str)
            or len(msg["code"]) > MAX_TEXT_CHARS
            or len(msg["message"]) > MAX_TEXT_CHARS
        ):
            raise PunchProtocolError("a refusal carries a text code and message", code="bad_punch")
        return dict(msg)
    if op != expected:
        raise PunchProtocolError(f"expected {expected!r}, got {op!r}", code="bad_punch")
    if op == "punch":
        parse_addr(msg.get("addr"))
    return dict(msg)


class PunchDecoder:
    """Bytes of a ``hole_punch`` stream in, the frame due at this step out (``punch`` or ``refused``
    for the upgrader; ``sync`` for the other end)."""

    def __init__(self) -> None:
        self._decoder = MessageDecoder(MAX_PUNCH_FRAME_BYTES)

    def receive_data(self, data: bytes) -> None:
        self._decoder.receive_data(data)

    def next_frame(self, expected: str) -> dict[str, Any] | None:
        try:
            msg = self._decoder.next_message()
        except DecodeError as exc:
            raise PunchProtocolError(f"bad punch frame: {exc}", code="bad_punch") from None
        return None if msg is None else _check(msg, expected)


def websocket_client(me: str, peer: str) -> bool:
    """On a punched connection the smaller node id is the websocket client and handshake initiator."""
    if me == peer:
        raise ValueError("a node does not punch to itself")
    return me < peer


def sync_delay_s(rtt_s: float) -> float:
    """How long the upgrader waits after sending ``sync``: half the measured relayed round trip (the
    time ``sync`` takes to reach the other end), capped at MAX_SYNC_DELAY_S."""
    return min(MAX_SYNC_DELAY_S, max(0.0, rtt_s) / 2)
