"""Typed errors of the mesh wire protocol, split by who is to blame.

`LocalProtocolError` is our bug (we tried to send something the spec forbids).
`RemoteProtocolError` is the peer's fault; its `code` is a stable, short reason
string (written in protocol/README.md) used in logs, counters, reject messages
and test vectors.
"""

from __future__ import annotations

from hydra_node.codec.errors import CodedError


class MeshError(CodedError):
    """Base of every mesh protocol error."""

    code = "error"


class LocalProtocolError(MeshError):
    """We were asked to send something the protocol forbids (a bug on our side)."""

    code = "local"


class RemoteProtocolError(MeshError):
    """The peer sent something the protocol forbids."""

    code = "remote"


class CborError(RemoteProtocolError):
    """Bytes that are not canonical CBOR of the restricted data model."""

    code = "cbor"


class EnvelopeError(RemoteProtocolError):
    """A signed envelope that is malformed, of the wrong context or badly signed."""

    code = "envelope"


class FrameRejected(RemoteProtocolError):
    """An encrypted link frame was rejected (codes: tamper, replay, reorder, oversize, bad_frame)."""

    code = "bad_frame"


class FlowControlError(RemoteProtocolError):
    """The peer broke the stream state machine or sent more than its credit."""

    code = "flow_control"


# --- handshake --------------------------------------------------------------------------


class HandshakeError(RemoteProtocolError):
    """The link handshake failed. `reply` is the reject message to send, if any."""

    code = "handshake"

    def __init__(self, message: str, *, code: str | None = None, reply: bytes | None = None) -> None:
        super().__init__(message, code=code)
        self.reply = reply


class GenerationMismatch(HandshakeError):
    """The two sides speak different protocol generations."""

    code = "generation_mismatch"

    def __init__(self, local: int, remote: object, *, reply: bytes | None = None) -> None:
        super().__init__(
            f"protocol generation mismatch: this node speaks generation {local}, the peer speaks generation {remote!r}",
            reply=reply,
        )
        self.local = local
        self.remote = remote


class AdmissionRefused(HandshakeError):
    """We refuse the peer: no valid mesh-key proof or invite token, or a foreign mesh."""

    code = "admission_refused"


class PeerAuthenticationFailed(HandshakeError):
    """The peer's node key signature or identity does not check out."""

    code = "peer_authentication_failed"


class RejectedByPeer(HandshakeError):
    """The peer refused us; `code` and the message are what the peer said."""

    code = "rejected_by_peer"


# --- invite tokens ----------------------------------------------------------------------


class TokenError(MeshError):
    """An invite token cannot be used."""

    code = "token"


class TokenMalformed(TokenError):
    code = "token_malformed"


class TokenExpired(TokenError):
    code = "token_expired"


class TokenForged(TokenError):
    code = "token_forged"


class TokenForeignMesh(TokenError):
    code = "token_foreign_mesh"


# --- links ------------------------------------------------------------------------------


class LinkClosed(MeshError):
    """The link is closed; `code` says why (e.g. peer_closed, tamper, idle_timeout)."""

    code = "link_closed"


class StreamReset(MeshError):
    """The stream was reset by the peer or by us; `code` is the reset code."""

    code = "reset"
