"""Link handshake (sans-IO): mutual Ed25519 authentication, X25519 key agreement, admission.

Four messages, each one websocket binary message of canonical CBOR::

    initiator                                   responder
    hello   {eph, gen, mesh, type}        -->
                                          <--   welcome {box, eph, gen, type}
    auth    {box, type}                   -->
                                          <--   accept  {box, type}
    (either side, instead of its next message: reject {code, gen, message, type})

The boxes are XChaCha20-Poly1305 under handshake keys derived from the
ephemeral X25519 secret; they carry the node keys, signatures over the running
transcript hash (which covers the generation, the mesh id and both ephemeral
keys) and the admission proof (a mesh-key MAC or an invite token). When the
initiator was admitted by token, accept carries the mesh key. Exact derivations
are in protocol/README.md and pinned by protocol/vectors/handshake.json. The messages and
their parser are in :mod:`.handshake_messages`; this module is the state machine.
The caller injects `now` and the ephemeral secret; nothing here reads a clock.
"""

from __future__ import annotations

import enum
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import nacl.bindings as sodium
import nacl.exceptions
import nacl.signing

from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.constants import MAX_HANDSHAKE_MESSAGE_BYTES, PROTOCOL_GENERATION
from hydra_node.mesh.wire.envelope import signing_input
from hydra_node.mesh.wire.errors import (
    AdmissionRefused,
    CborError,
    GenerationMismatch,
    HandshakeError,
    LocalProtocolError,
    PeerAuthenticationFailed,
    RejectedByPeer,
    TokenError,
)
from hydra_node.mesh.wire.handshake_messages import (
    Accept,
    Auth,
    HandshakeMessage,
    Hello,
    Reject,
    Welcome,
    handshake_failure,
    parse_handshake_message,
)
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key
from hydra_node.mesh.wire.token import InviteToken, parse_invite
from hydra_node.statemachine import InvalidTransition, StateTable

__all__ = [
    "Accept",
    "Auth",
    "Handshake",
    "HandshakeMessage",
    "HandshakeResult",
    "HandshakeState",
    "Hello",
    "MESH_PROOF_INITIATOR",
    "MESH_PROOF_RESPONDER",
    "Reject",
    "TRANSCRIPT_LABEL",
    "TRANSITIONS",
    "Welcome",
    "aead_nonce",
    "derive_key",
    "parse_handshake_message",
]

TRANSCRIPT_LABEL = b"hydra/handshake\x00"
MESH_PROOF_RESPONDER = b"hydra/1/mesh-proof-responder"
MESH_PROOF_INITIATOR = b"hydra/1/mesh-proof-initiator"
_ZERO16 = bytes(16)


def _h(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


def derive_key(shared: bytes, transcript: bytes, label: bytes) -> bytes:
    """KDF: keyed BLAKE2b-256 with the X25519 secret as key over transcript || label."""
    return hashlib.blake2b(transcript + label, key=shared, digest_size=32).digest()


def aead_nonce(counter: int) -> bytes:
    """24-byte XChaCha20 nonce: 16 zero bytes then the counter as u64 big-endian."""
    return _ZERO16 + counter.to_bytes(8, "big")


def _seal(key: bytes, counter: int, aad: bytes, payload: dict[str, Any]) -> bytes:
    return sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(cbor.encode(payload), aad, aead_nonce(counter), key)


# --- result and state machine -----------------------------------------------------------


@dataclass(frozen=True)
class HandshakeResult:
    """What an authenticated, admitted link knows about itself and its peer."""

    is_initiator: bool
    peer_public_key: bytes
    mesh: MeshSecret
    admitted_by: str  # "mac" or "token"
    session_id: bytes
    send_key: bytes = field(repr=False)
    receive_key: bytes = field(repr=False)
    invite_nonce: bytes | None = None

    @property
    def peer_id(self) -> str:
        return node_id_from_public_key(self.peer_public_key)


class HandshakeState(enum.Enum):
    """Where one side of a handshake is (the values appear in error messages)."""

    START = "start"  # initiator, before initiate()
    WAIT_WELCOME = "wait_welcome"
    WAIT_ACCEPT = "wait_accept"
    WAIT_HELLO = "wait_hello"  # responder, before the hello
    WAIT_AUTH = "wait_auth"
    DONE = "done"
    FAILED = "failed"


_H = HandshakeState
# role -> state -> {received message type: next state}; anything else is a protocol error.
TRANSITIONS: dict[str, dict[HandshakeState, dict[type, HandshakeState]]] = {
    "initiator": {
        _H.START: {},
        _H.WAIT_WELCOME: {Welcome: _H.WAIT_ACCEPT},
        _H.WAIT_ACCEPT: {Accept: _H.DONE},
        _H.DONE: {},
    },
    "responder": {_H.WAIT_HELLO: {Hello: _H.WAIT_AUTH}, _H.WAIT_AUTH: {Auth: _H.DONE}, _H.DONE: {}},
}
HANDSHAKE_MACHINES = {role: StateTable(f"{role} handshake", moves) for role, moves in TRANSITIONS.items()}


class Handshake:
    """One side of a link handshake. Feed it the peer's messages; send what it returns.

    Initiator: `credential` is the MeshSecret of a member or the InviteToken of a joiner.
    Responder: `credential` is its MeshSecret; `trusted_issuer(node_id)` says whether an
    invite issued by that node is honoured (the responder's own invites always are);
    `check_invite(token)` may then refuse it with a TokenError (revoked, used up ...).
    Any HandshakeError raised carries `reply`: the reject message to send, if any.
    """

    def __init__(
        self,
        role: str,
        identity: nacl.signing.SigningKey,
        credential: MeshSecret | InviteToken,
        *,
        now: float,
        ephemeral_secret: bytes | None = None,
        expected_peer_id: str | None = None,
        trusted_issuer: Callable[[str], bool] | None = None,
        check_invite: Callable[[InviteToken], None] | None = None,
    ) -> None:
        if role not in ("initiator", "responder"):
            raise LocalProtocolError(f"role must be initiator or responder, not {role!r}")
        if role == "responder" and not isinstance(credential, MeshSecret):
            raise LocalProtocolError("a responder must be a mesh member (MeshSecret)")
        self.role = role
        self.state = HandshakeState.START if role == "initiator" else HandshakeState.WAIT_HELLO
        self._identity = identity
        self._public = bytes(identity.verify_key)
        self._credential = credential
        self._now = now
        self._eph_secret = ephemeral_secret if ephemeral_secret is not None else os.urandom(32)
        self._eph_public = sodium.crypto_scalarmult_base(self._eph_secret)
        self._expected_peer_id = expected_peer_id
        self._trusted_issuer = trusted_issuer
        self._check_invite = check_invite
        self._mesh_id = credential.mesh_id
        self._result: HandshakeResult | None = None
        # transcript state
        self._h = b""
        self._shared = b""
        self._k_r2i = b""
        self._k_i2r = b""
        self._peer_key = b""
        self._peer_mac = b""
        self._h_welcome = b""

    @property
    def complete(self) -> bool:
        return self._result is not None

    @property
    def result(self) -> HandshakeResult:
        if self._result is None:
            raise LocalProtocolError(f"handshake not complete (state {self.state.value})")
        return self._result

    def initiate(self) -> bytes:
        """The initiator's first message (hello)."""
        if (self.role, self.state) != ("initiator", HandshakeState.START):
            raise LocalProtocolError(f"initiate() called in state {self.role}/{self.state.value}")
        hello = Hello(eph=self._eph_public, mesh=self._mesh_id).encode()
        self._h = _h(TRANSCRIPT_LABEL + hello)
        self.state = HandshakeState.WAIT_WELCOME
        return hello

    def receive(self, data: bytes) -> bytes | None:
        """Process one message from the peer; return the message to send next, if any."""
        try:
            msg = parse_handshake_message(data)
            if isinstance(msg, Reject):
                self.state = HandshakeState.FAILED
                if msg.code == "generation_mismatch" or msg.gen != PROTOCOL_GENERATION:
                    raise GenerationMismatch(PROTOCOL_GENERATION, msg.gen)
                raise RejectedByPeer(f"peer refused the handshake: {msg.code}: {msg.message}", code=msg.code)
            try:
                next_state = HANDSHAKE_MACHINES[self.role].next(self.state, type(msg))
            except InvalidTransition as exc:
                raise handshake_failure(
                    HandshakeError,
                    "bad_handshake",
                    f"unexpected {type(msg).__name__.lower()} in state {self.role}/{self.state.value}",
                ) from exc
            reply: bytes | None = getattr(self, f"_on_{type(msg).__name__.lower()}")(msg, data)
            self.state = next_state
            return reply
        except HandshakeError:
            self.state = HandshakeState.FAILED
            raise

    # -- responder side --

    def _on_hello(self, msg: Hello, raw: bytes) -> bytes:
        if msg.mesh != self._mesh_id:
            raise handshake_failure(
                AdmissionRefused, "foreign_mesh", "this node belongs to another mesh"
            )  # never name ours to a stranger
        self._h = _h(TRANSCRIPT_LABEL + raw)
        self._agree(msg.eph, responder_eph=self._eph_public)
        mesh: MeshSecret = self._credential  # type: ignore[assignment]
        payload = {
            "key": self._public,
            "mac": mesh.mac(MESH_PROOF_RESPONDER, self._h + self._public),
            "sig": self._identity.sign(signing_input("handshake-responder", self._h)).signature,
        }
        box = _seal(self._k_r2i, 0, self._h, payload)
        self._h = _h(self._h + cbor.encode(payload))
        return Welcome(eph=self._eph_public, box=box).encode()

    def _on_auth(self, msg: Auth, raw: bytes) -> bytes:
        payload = self._open(self._k_i2r, 0, msg.box, "auth")
        mesh: MeshSecret = self._credential  # type: ignore[assignment]
        key_sig = _key_sig(payload)
        if set(payload) not in ({"key", "sig", "mac"}, {"key", "sig", "token"}) or key_sig is None:
            raise handshake_failure(
                HandshakeError, "bad_handshake", "auth payload must be {key, sig, mac} or {key, sig, token}"
            )
        key, sig = key_sig
        self._verify(key, signing_input("handshake-initiator", self._h), sig)
        invite_nonce = None
        if "mac" in payload:
            if not isinstance(payload["mac"], bytes) or not mesh.check_mac(
                MESH_PROOF_INITIATOR, self._h + key, payload["mac"]
            ):
                raise handshake_failure(AdmissionRefused, "bad_mesh_proof", "the peer does not know this mesh's key")
            admitted_by = "mac"
        else:
            try:
                token = parse_invite(payload["token"], self._now, expected_mesh_id=self._mesh_id)
            except TokenError as exc:
                raise handshake_failure(AdmissionRefused, exc.code, str(exc)) from None
            issuer = token.issuer_id
            if token.issuer_public_key != self._public and not (self._trusted_issuer and self._trusted_issuer(issuer)):
                raise handshake_failure(
                    AdmissionRefused, "untrusted_issuer", f"invite issued by {issuer}, which is not a known member"
                )
            if self._check_invite is not None:
                try:
                    self._check_invite(token)
                except TokenError as exc:
                    raise handshake_failure(AdmissionRefused, exc.code, str(exc)) from None
            admitted_by, invite_nonce = "token", token.nonce
        self._h = _h(self._h + cbor.encode(payload))
        accept: dict[str, Any] = {"admitted": admitted_by}
        if admitted_by == "token":
            accept["mesh_key"] = mesh.mesh_key
        box = _seal(self._k_r2i, 1, self._h, accept)
        self._h = _h(self._h + cbor.encode(accept))
        self._finish(key, mesh, admitted_by, invite_nonce)
        return Accept(box=box).encode()

    # -- initiator side --

    def _on_welcome(self, msg: Welcome, raw: bytes) -> bytes:
        self._agree(msg.eph, responder_eph=msg.eph)
        payload = self._open(self._k_r2i, 0, msg.box, "welcome")
        key_sig, mac = _key_sig(payload), payload.get("mac")
        if set(payload) != {"key", "mac", "sig"} or key_sig is None or not isinstance(mac, bytes):
            raise handshake_failure(HandshakeError, "bad_handshake", "welcome payload must be {key, mac, sig}")
        key, sig = key_sig
        self._verify(key, signing_input("handshake-responder", self._h), sig)
        if self._expected_peer_id is not None and node_id_from_public_key(key) != self._expected_peer_id:
            raise handshake_failure(
                PeerAuthenticationFailed,
                "unexpected_peer",
                f"expected peer {self._expected_peer_id}, got {node_id_from_public_key(key)}",
            )
        if isinstance(self._credential, MeshSecret):
            if not self._credential.check_mac(MESH_PROOF_RESPONDER, self._h + key, mac):
                raise handshake_failure(AdmissionRefused, "bad_mesh_proof", "the peer does not know this mesh's key")
        self._peer_key, self._peer_mac = key, mac
        h_welcome = self._h
        self._h = _h(self._h + cbor.encode(payload))
        auth: dict[str, Any] = {
            "key": self._public,
            "sig": self._identity.sign(signing_input("handshake-initiator", self._h)).signature,
        }
        if isinstance(self._credential, MeshSecret):
            auth["mac"] = self._credential.mac(MESH_PROOF_INITIATOR, self._h + self._public)
        else:
            auth["token"] = self._credential.text
        self._h_welcome = h_welcome
        box = _seal(self._k_i2r, 0, self._h, auth)
        self._h = _h(self._h + cbor.encode(auth))
        return Auth(box=box).encode()

    def _on_accept(self, msg: Accept, raw: bytes) -> None:
        payload = self._open(self._k_r2i, 1, msg.box, "accept")
        if isinstance(self._credential, MeshSecret):
            if payload != {"admitted": "mac"}:
                raise handshake_failure(
                    HandshakeError, "bad_handshake", "a member's accept must be exactly {admitted: mac}"
                )
            mesh = self._credential
        else:
            mesh_key = payload.get("mesh_key")
            if (
                set(payload) != {"admitted", "mesh_key"}
                or payload["admitted"] != "token"
                or not isinstance(mesh_key, bytes)
                or len(mesh_key) != 32
            ):
                raise handshake_failure(
                    HandshakeError, "bad_handshake", "a joiner's accept must be {admitted: token, mesh_key}"
                )
            mesh = MeshSecret(mesh_key)
            if mesh.mesh_id != self._credential.mesh_id:
                raise handshake_failure(
                    PeerAuthenticationFailed,
                    "bad_mesh_key",
                    "the mesh key received does not match the invite's mesh id",
                )
            if not mesh.check_mac(MESH_PROOF_RESPONDER, self._h_welcome + self._peer_key, self._peer_mac):
                raise handshake_failure(
                    PeerAuthenticationFailed,
                    "bad_mesh_proof",
                    "the responder's mesh proof does not match the mesh key it sent",
                )
        self._h = _h(self._h + cbor.encode(payload))
        self._finish(self._peer_key, mesh, payload["admitted"], None)
        return None

    # -- shared --

    def _agree(self, peer_eph: bytes, *, responder_eph: bytes) -> None:
        try:
            self._shared = sodium.crypto_scalarmult(self._eph_secret, peer_eph)
        except (
            nacl.exceptions.CryptoError,
            nacl.exceptions.RuntimeError,
            nacl.exceptions.TypeError,
            nacl.exceptions.ValueError,
        ):
            raise handshake_failure(
                PeerAuthenticationFailed, "bad_ephemeral", "the peer's ephemeral key is a low-order point"
            ) from None
        if self._shared == bytes(32):
            raise handshake_failure(
                PeerAuthenticationFailed, "bad_ephemeral", "the peer's ephemeral key is a low-order point"
            )
        self._h = _h(self._h + responder_eph)
        self._k_r2i = derive_key(self._shared, self._h, b"hs r2i")
        self._k_i2r = derive_key(self._shared, self._h, b"hs i2r")

    def _open(self, key: bytes, counter: int, box: bytes, what: str) -> dict[str, Any]:
        try:
            plain = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(box, self._h, aead_nonce(counter), key)
        except nacl.exceptions.CryptoError:
            raise handshake_failure(
                HandshakeError, "bad_handshake", f"{what} box does not decrypt (tampered or wrong keys)"
            ) from None
        try:
            payload = cbor.decode(plain, max_size=MAX_HANDSHAKE_MESSAGE_BYTES)
        except CborError as exc:
            raise handshake_failure(
                HandshakeError, "bad_handshake", f"{what} payload is not canonical CBOR: {exc}"
            ) from None
        if not isinstance(payload, dict):
            raise handshake_failure(HandshakeError, "bad_handshake", f"{what} payload must be a map")
        return payload

    def _verify(self, key: bytes, message: bytes, sig: bytes) -> None:
        try:
            nacl.signing.VerifyKey(key).verify(message, sig)
        except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, nacl.exceptions.TypeError):
            raise handshake_failure(
                PeerAuthenticationFailed, "bad_signature", "the peer's node key signature does not verify"
            ) from None
        if key == self._public:
            raise handshake_failure(
                PeerAuthenticationFailed, "self_connection", "the peer has this node's own identity"
            )

    def _finish(self, peer_key: bytes, mesh: MeshSecret, admitted_by: str, invite_nonce: bytes | None) -> None:
        k_i2r = derive_key(self._shared, self._h, b"app i2r")
        k_r2i = derive_key(self._shared, self._h, b"app r2i")
        initiator = self.role == "initiator"
        self._result = HandshakeResult(
            is_initiator=initiator,
            peer_public_key=peer_key,
            mesh=mesh,
            admitted_by=admitted_by,
            session_id=self._h,
            send_key=k_i2r if initiator else k_r2i,
            receive_key=k_r2i if initiator else k_i2r,
            invite_nonce=invite_nonce,
        )


def _key_sig(payload: dict[str, Any]) -> tuple[bytes, bytes] | None:
    """The payload's ``key`` (an Ed25519 public key) and ``sig`` (a signature), if well-formed."""
    key, sig = payload.get("key"), payload.get("sig")
    if isinstance(key, bytes) and len(key) == 32 and isinstance(sig, bytes) and len(sig) == 64:
        return key, sig
    return None
