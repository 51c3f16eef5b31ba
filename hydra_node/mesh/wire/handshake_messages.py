"""Link handshake messages (sans-IO): the five frozen message types and their strict parser.

``parse_handshake_message`` turns one websocket message into a message or raises a
:class:`HandshakeError` carrying the reject to send (``bad_handshake``, ``generation_mismatch``).
The state machine that sends and checks them is :mod:`.handshake`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.constants import MAX_HANDSHAKE_MESSAGE_BYTES, PROTOCOL_GENERATION
from hydra_node.mesh.wire.errors import CborError, GenerationMismatch, HandshakeError, LocalProtocolError
from hydra_node.mesh.wire.ids import is_mesh_id

__all__ = [
    "Accept",
    "Auth",
    "HandshakeMessage",
    "Hello",
    "Reject",
    "Welcome",
    "handshake_failure",
    "parse_handshake_message",
]


def handshake_failure(cls: type[HandshakeError], code: str, message: str) -> HandshakeError:
    """A handshake error of ``cls`` whose reply is the matching reject message."""
    return cls(message, code=code, reply=Reject(code=code, message=message).encode())


# --- messages --------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    eph: bytes
    mesh: str
    gen: int = PROTOCOL_GENERATION

    def __post_init__(self) -> None:
        if len(self.eph) != 32 or not is_mesh_id(self.mesh):
            raise LocalProtocolError("hello needs a 32-byte ephemeral key and a mesh id")

    def encode(self) -> bytes:
        return cbor.encode({"eph": self.eph, "gen": self.gen, "mesh": self.mesh, "type": "hello"})


@dataclass(frozen=True)
class Welcome:
    eph: bytes
    box: bytes
    gen: int = PROTOCOL_GENERATION

    def encode(self) -> bytes:
        return cbor.encode({"box": self.box, "eph": self.eph, "gen": self.gen, "type": "welcome"})


@dataclass(frozen=True)
class Auth:
    box: bytes

    def encode(self) -> bytes:
        return cbor.encode({"box": self.box, "type": "auth"})


@dataclass(frozen=True)
class Accept:
    box: bytes

    def encode(self) -> bytes:
        return cbor.encode({"box": self.box, "type": "accept"})


@dataclass(frozen=True)
class Reject:
    code: str
    message: str
    gen: int = PROTOCOL_GENERATION

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or not isinstance(self.message, str) or len(self.message) > 1024:
            raise LocalProtocolError("reject needs a code and a message of at most 1024 characters")

    def encode(self) -> bytes:
        return cbor.encode({"code": self.code, "gen": self.gen, "message": self.message, "type": "reject"})


HandshakeMessage = Hello | Welcome | Auth | Accept | Reject
_FIELDS = {
    "hello": {"eph", "gen", "mesh", "type"},
    "welcome": {"box", "eph", "gen", "type"},
    "auth": {"box", "type"},
    "accept": {"box", "type"},
    "reject": {"code", "gen", "message", "type"},
}


def parse_handshake_message(data: bytes) -> HandshakeMessage:
    """Decode one handshake message; HandshakeError (code bad_handshake or generation_mismatch)."""
    try:
        msg = cbor.decode(data, max_size=MAX_HANDSHAKE_MESSAGE_BYTES)
    except CborError as exc:
        raise handshake_failure(
            HandshakeError, "bad_handshake", f"handshake message is not canonical CBOR ({exc.code}): {exc}"
        ) from None
    kind = msg.get("type") if isinstance(msg, dict) else None
    if kind not in _FIELDS:
        raise handshake_failure(HandshakeError, "bad_handshake", f"unknown handshake message type {kind!r}")
    if "gen" in _FIELDS[kind] and not isinstance(msg.get("gen"), int):
        raise handshake_failure(HandshakeError, "bad_handshake", f"{kind} must carry an integer protocol generation")
    if "gen" in _FIELDS[kind] and msg.get("gen") != PROTOCOL_GENERATION:
        if kind == "reject" and isinstance(msg.get("code"), str) and isinstance(msg.get("message"), str):
            return Reject(code=msg["code"], message=msg["message"][:1024], gen=msg.get("gen"))
        raise GenerationMismatch(
            PROTOCOL_GENERATION,
            msg.get("gen"),
            reply=Reject(
                code="generation_mismatch", message=f"this node speaks protocol generation {PROTOCOL_GENERATION}"
            ).encode(),
        )
    if set(msg) != _FIELDS[kind]:
        raise handshake_failure(
            HandshakeError, "bad_handshake", f"{kind} must have exactly the fields {sorted(_FIELDS[kind])}"
        )
    try:
        if kind == "hello":
            return Hello(eph=msg["eph"], mesh=msg["mesh"])
        if kind == "welcome":
            if not isinstance(msg["eph"], bytes) or len(msg["eph"]) != 32 or not isinstance(msg["box"], bytes):
                raise LocalProtocolError("welcome needs eph (32 bytes) and box (bytes)")
            return Welcome(eph=msg["eph"], box=msg["box"])
        if kind in ("auth", "accept"):
            if not isinstance(msg["box"], bytes):
                raise LocalProtocolError(f"{kind} box must be bytes")
            return Auth(box=msg["box"]) if kind == "auth" else Accept(box=msg["box"])
        return Reject(code=msg["code"], message=msg["message"])
    except (LocalProtocolError, TypeError) as exc:
        raise handshake_failure(HandshakeError, "bad_handshake", f"invalid {kind}: {exc}") from None
