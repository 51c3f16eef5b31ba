"""The relay protocol's messages (sans-IO): stream headers, replies, and the relayed byte framing.

Every relay exchange is a mesh stream on an ordinary link (protocol/README.md, "Relays"):

* ``relay_reserve`` (client → relay): the relay answers one ``reserved`` (or ``refused``) frame and
  keeps the stream open; the reservation lives while the stream does (at most ``ttl_s``).
* ``relay_connect`` {target} (dialler → relay): the relay opens ``relay_incoming`` {from, observed} on
  its link to the target, which answers ``accepted`` (or ``refused``); the relay then answers the
  dialler ``connected`` {observed} (or ``refused``) and splices the two streams' raw bytes.
  ``observed`` is the IP address the relay sees that node's link come from (its public address,
  behind NAT), for hole punching (``punch.py``); it is absent when the relay does not know it.
  ``peer_observed`` (same form) is the *other* end's IP as the relay sees it: the only host a hole
  punch may connect to (a member cannot name another one).
* ``reach_dialback`` {addrs, nonce} (node → peer): the peer dials each address back and answers one
  ``dialback`` frame {results: {addr: bool}}.

Replies are length-prefixed canonical CBOR maps (``codec/framing.py``). After ``connected`` /
``accepted`` the stream carries *relayed frames*: a 4-byte big-endian length and that many opaque
bytes — the end-to-end handshake, then secure-channel frames the relay cannot read.
Untrusted input yields a typed value or a :class:`RelayProtocolError`, nothing else.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.mesh.wire.constants import MAX_LINK_FRAME_BYTES
from hydra_node.mesh.wire.errors import RemoteProtocolError
from hydra_node.mesh.wire.ids import is_node_id

__all__ = [
    "CONNECT_KIND",
    "DIALBACK_KIND",
    "INCOMING_KIND",
    "MAX_DIALBACK_ADDRS",
    "MAX_REPLY_BYTES",
    "MAX_RELAYED_FRAME_BYTES",
    "NONCE_BYTES",
    "RELAY_VERSION",
    "RESERVE_KIND",
    "ConnectRequest",
    "DialbackRequest",
    "IncomingRequest",
    "RelayProtocolError",
    "ReplyDecoder",
    "encode_relayed_frame",
    "encode_reply",
    "is_ip_text",
    "observed_fields",
    "parse_connect",
    "parse_dialback",
    "parse_incoming",
    "parse_reply",
    "relayed_frame_decoder",
]

RELAY_VERSION = 1
RESERVE_KIND = "relay_reserve"
CONNECT_KIND = "relay_connect"
INCOMING_KIND = "relay_incoming"
DIALBACK_KIND = "reach_dialback"
NONCE_BYTES = 16
MAX_DIALBACK_ADDRS = 8
"""Addresses one dial-back request may name (a node advertises a few; more is abuse)."""
MAX_ADDR_CHARS = 256
MAX_IP_CHARS = 45
"""The longest IPv6 text (``observed``)."""
MAX_REPLY_BYTES = 4096
"""Largest reply frame (a dial-back result over MAX_DIALBACK_ADDRS addresses fits easily)."""
MAX_RELAYED_FRAME_BYTES = MAX_LINK_FRAME_BYTES
"""A relayed frame carries one link frame of the end-to-end link, so the link's own bound."""
MAX_TEXT_CHARS = 200
_LEN = struct.Struct(">I")
_REPLY_OPS = {"reserved", "connected", "accepted", "refused", "dialback"}


class RelayProtocolError(RemoteProtocolError):
    """A peer sent a relay header or reply that breaks the protocol (codes: bad_relay_header, bad_reply)."""

    code = "bad_relay_message"


@dataclass(frozen=True)
class ConnectRequest:
    target: str


@dataclass(frozen=True)
class IncomingRequest:
    source: str
    observed: str | None = None
    """The target's public IP as the relay sees its link (for hole punching; absent: unknown)."""
    peer_observed: str | None = None
    """The dialler's public IP as the relay sees its link: where a hole punch goes (absent: no punch)."""


@dataclass(frozen=True)
class DialbackRequest:
    addrs: tuple[str, ...]
    nonce: bytes


def _version(header: Mapping[str, Any]) -> None:
    if header.get("v") != RELAY_VERSION:
        raise RelayProtocolError(f"relay version {header.get('v')!r} is not {RELAY_VERSION}", code="bad_relay_header")


def _node(header: Mapping[str, Any], key: str) -> str:
    value = header.get(key)
    if not isinstance(value, str) or not is_node_id(value):
        raise RelayProtocolError(f"relay header {key!r} must be a node id", code="bad_relay_header")
    return value


def parse_connect(header: Mapping[str, Any]) -> ConnectRequest:
    _version(header)
    return ConnectRequest(_node(header, "target"))


def parse_incoming(header: Mapping[str, Any]) -> IncomingRequest:
    _version(header)
    observed, peer_observed = header.get("observed"), header.get("peer_observed")
    for key, value in (("observed", observed), ("peer_observed", peer_observed)):
        if value is not None and not is_ip_text(value):
            raise RelayProtocolError(f"relay header {key!r} must be an IP address", code="bad_relay_header")
    return IncomingRequest(_node(header, "from"), observed, peer_observed)


def is_ip_text(value: Any) -> bool:
    """An IPv4 or IPv6 address as text (the ``observed`` field)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_IP_CHARS:
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def observed_fields(own: str | None, peer: str | None) -> dict[str, str]:
    """The relay's ``observed`` / ``peer_observed`` entries for one end of a circuit: that end's IP
    and the other end's, as the relay sees their links (each left out when unknown)."""
    fields = {"observed": own, "peer_observed": peer}
    return {k: v for k, v in fields.items() if v is not None}


def parse_dialback(header: Mapping[str, Any]) -> DialbackRequest:
    _version(header)
    addrs, nonce = header.get("addrs"), header.get("nonce")
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise RelayProtocolError(f"dial-back nonce must be {NONCE_BYTES} bytes", code="bad_relay_header")
    if (
        not isinstance(addrs, list)
        or not 1 <= len(addrs) <= MAX_DIALBACK_ADDRS
        or not all(isinstance(a, str) and 0 < len(a) <= MAX_ADDR_CHARS for a in addrs)
    ):
        raise RelayProtocolError(f"dial-back addrs must be 1..{MAX_DIALBACK_ADDRS} texts", code="bad_relay_header")
    return DialbackRequest(tuple(addrs), nonce)


def encode_reply(op: str, **fields: Any) -> bytes:
    """One reply frame; ``refused`` carries ``code`` and ``message``."""
    if op not in _REPLY_OPS:
        raise ValueError(f"unknown relay reply {op!r}")
    return encode_message({"op": op, **fields}, limit=MAX_REPLY_BYTES)


def parse_reply(msg: Mapping[str, Any], expected: str) -> dict[str, Any]:
    """Check a decoded reply: ``expected`` (its fields checked) or ``refused``; anything else is an error."""
    op = msg.get("op")
    if op == "refused":
        if not isinstance(msg.get("code"), str) or not isinstance(msg.get("message"), str):
            raise RelayProtocolError("a refusal carries a text code and message", code="bad_reply")
        return dict(msg)
    if op != expected:
        raise RelayProtocolError(f"expected {expected!r}, got {op!r}", code="bad_reply")
    if op == "reserved":
        for key in ("ttl_s", "bytes_per_s", "circuits"):
            if type(msg.get(key)) is not int or msg[key] < 0:
                raise RelayProtocolError(f"reserved.{key} must be an unsigned integer", code="bad_reply")
    for key in ("observed", "peer_observed"):
        if op == "connected" and key in msg and not is_ip_text(msg[key]):
            raise RelayProtocolError(f"connected.{key} must be an IP address", code="bad_reply")
    if op == "dialback":
        results = msg.get("results")
        if (
            not isinstance(results, dict)
            or len(results) > MAX_DIALBACK_ADDRS
            or not all(isinstance(k, str) and isinstance(v, bool) for k, v in results.items())
        ):
            raise RelayProtocolError("dialback.results must map addresses to booleans", code="bad_reply")
    return dict(msg)


class ReplyDecoder:
    """Bytes of a relay stream in, one reply out (then the bytes after it, which are relayed frames)."""

    def __init__(self) -> None:
        self._decoder = MessageDecoder(MAX_REPLY_BYTES)

    def receive_data(self, data: bytes) -> None:
        self._decoder.receive_data(data)

    def next_reply(self, expected: str) -> dict[str, Any] | None:
        try:
            msg = self._decoder.next_message()
        except DecodeError as exc:
            raise RelayProtocolError(f"bad relay reply: {exc}", code="bad_reply") from None
        return None if msg is None else parse_reply(msg, expected)

    def take_unconsumed(self) -> bytes:
        return self._decoder.take_unconsumed()


def encode_relayed_frame(payload: bytes) -> bytes:
    if len(payload) > MAX_RELAYED_FRAME_BYTES:
        raise ValueError(f"relayed frame of {len(payload)} bytes exceeds {MAX_RELAYED_FRAME_BYTES}")
    return _LEN.pack(len(payload)) + payload


def relayed_frame_decoder(limit: int = MAX_RELAYED_FRAME_BYTES) -> MessageDecoder:
    """A decoder of relayed frames: use ``next_frame()`` (opaque bodies, never decoded as CBOR)."""
    return MessageDecoder(limit)
