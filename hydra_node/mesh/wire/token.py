"""Invite tokens (sans-IO): base64url, no padding, of a signed envelope.

The envelope (context ``invite``) is signed by the issuing member's node key and
its body is::

    {"addrs": [text, ...], "exp": uint, "mesh": text, "nonce": bytes(16)[, "uses": uint]}

`addrs` are ``ws://host:port`` URLs or ``host:port`` pairs where the issuer
listens; `exp` is the expiry in unix seconds; `mesh` the mesh id; `nonce` makes
every token unique and is its id (hex: :attr:`InviteToken.token_id`); `uses`, when
present (1..MAX_INVITE_USES), limits how many joiners the token admits — such a token
is redeemed by its issuer only (protocol/README.md section 6.1). A token without
`uses` (every token before it existed) admits any number until it expires or is
revoked: whoever holds it may join the mesh (see protocol/README.md, "Admission").
"""

from __future__ import annotations

import base64
import binascii
import datetime
import os
from dataclasses import dataclass, field

import nacl.signing

from hydra_node.mesh.wire.constants import MAX_ADDR_CHARS, MAX_INVITE_ADDRS, MAX_TOKEN_CHARS
from hydra_node.mesh.wire.envelope import open_envelope, seal
from hydra_node.mesh.wire.errors import (
    EnvelopeError,
    LocalProtocolError,
    TokenError,
    TokenExpired,
    TokenForeignMesh,
    TokenForged,
    TokenMalformed,
)
from hydra_node.mesh.wire.ids import is_mesh_id, node_id_from_public_key

__all__ = [
    "INVITE_CONTEXT",
    "MAX_INVITE_USES",
    "NONCE_BYTES",
    "InviteToken",
    "TokenIssuerOnly",
    "TokenRevoked",
    "TokenUnknown",
    "TokenUsedUp",
    "addr_to_url",
    "issue_invite",
    "parse_invite",
]

INVITE_CONTEXT = "invite"
NONCE_BYTES = 16
#: Largest ``uses`` a token may carry (a bigger number is no limit worth counting).
MAX_INVITE_USES = 1000
_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class TokenRevoked(TokenError):
    """Its issuer revoked the token (its signed revocation list names the token id)."""

    code = "token_revoked"


class TokenUsedUp(TokenError):
    """A ``uses``-limited token that already admitted as many joiners as it allows."""

    code = "token_used_up"


class TokenIssuerOnly(TokenError):
    """A ``uses``-limited token presented to a member other than its issuer."""

    code = "token_issuer_only"


class TokenUnknown(TokenError):
    """A ``uses``-limited token its issuer has no record of (its records were lost)."""

    code = "token_unknown"


def _valid_uses(uses: object) -> bool:
    return uses is None or (isinstance(uses, int) and not isinstance(uses, bool) and 1 <= uses <= MAX_INVITE_USES)


def _valid_addr(addr: object) -> bool:
    return (
        isinstance(addr, str)
        and 0 < len(addr) <= MAX_ADDR_CHARS
        and addr.isascii()
        and addr.isprintable()
        and " " not in addr
        and (addr.startswith(("ws://", "wss://")) or ":" in addr)
    )


def addr_to_url(addr: str) -> str:
    """``host:port`` → ``ws://host:port``; URLs are returned unchanged."""
    return addr if addr.startswith(("ws://", "wss://")) else f"ws://{addr}"


@dataclass(frozen=True)
class InviteToken:
    """A parsed, signature-checked invite token; `text` is what gets presented."""

    mesh_id: str
    issuer_public_key: bytes
    addrs: tuple[str, ...]
    expires_at: int
    nonce: bytes
    text: str = field(repr=False)
    uses: int | None = None

    def __post_init__(self) -> None:
        if not is_mesh_id(self.mesh_id):
            raise TokenMalformed(f"invite token mesh id {self.mesh_id!r} is not 32 lowercase hex characters")
        if not isinstance(self.issuer_public_key, bytes) or len(self.issuer_public_key) != 32:
            raise TokenMalformed("invite token issuer key must be 32 bytes")
        if not isinstance(self.addrs, tuple) or not 0 < len(self.addrs) <= MAX_INVITE_ADDRS:
            raise TokenMalformed(f"invite token must list 1..{MAX_INVITE_ADDRS} addresses")
        for addr in self.addrs:
            if not _valid_addr(addr):
                raise TokenMalformed(f"invite token address {addr!r} is not ws://host:port or host:port")
        if isinstance(self.expires_at, bool) or not isinstance(self.expires_at, int) or self.expires_at < 0:
            raise TokenMalformed("invite token expiry must be unix seconds")
        if not isinstance(self.nonce, bytes) or len(self.nonce) != NONCE_BYTES:
            raise TokenMalformed(f"invite token nonce must be {NONCE_BYTES} bytes")
        if not isinstance(self.text, str) or not 0 < len(self.text) <= MAX_TOKEN_CHARS:
            raise TokenMalformed(f"invite token text must be 1..{MAX_TOKEN_CHARS} characters")
        if not _valid_uses(self.uses):
            raise TokenMalformed(f"invite token uses must be an integer 1..{MAX_INVITE_USES}")

    @property
    def token_id(self) -> str:
        """The token's id: hex of its nonce (what ``invite list`` shows and ``invite revoke`` takes)."""
        return self.nonce.hex()

    @property
    def issuer_id(self) -> str:
        return node_id_from_public_key(self.issuer_public_key)

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(addr_to_url(a) for a in self.addrs)


def issue_invite(
    signing_key: nacl.signing.SigningKey,
    mesh_id: str,
    addrs: list[str] | tuple[str, ...],
    ttl_s: float,
    now: float,
    *,
    nonce: bytes | None = None,
    uses: int | None = None,
) -> str:
    """A new invite token for `mesh_id`, valid until ``now + ttl_s``, admitting at most ``uses``
    joiners (None: no limit; the body then has no ``uses`` key, as before the key existed)."""
    if not is_mesh_id(mesh_id):
        raise LocalProtocolError(f"{mesh_id!r} is not a mesh id")
    addrs = tuple(addrs)
    if not 0 < len(addrs) <= MAX_INVITE_ADDRS or not all(_valid_addr(a) for a in addrs):
        raise LocalProtocolError(f"invite addresses must be 1..{MAX_INVITE_ADDRS} ws://host:port or host:port strings")
    if ttl_s <= 0:
        raise LocalProtocolError("invite ttl must be positive")
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    if len(nonce) != NONCE_BYTES:
        raise LocalProtocolError(f"invite nonce must be {NONCE_BYTES} bytes")
    if not _valid_uses(uses):
        raise LocalProtocolError(f"invite uses must be an integer 1..{MAX_INVITE_USES}")
    body = {"addrs": list(addrs), "exp": int(now + ttl_s), "mesh": mesh_id, "nonce": nonce}
    if uses is not None:
        body["uses"] = uses
    raw = seal(signing_key, INVITE_CONTEXT, body)
    text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(text) > MAX_TOKEN_CHARS:
        raise LocalProtocolError(f"invite token would exceed {MAX_TOKEN_CHARS} characters; list fewer addresses")
    return text


def parse_invite(text: str, now: float, expected_mesh_id: str | None = None) -> InviteToken:
    """Check an invite token; raise TokenMalformed/TokenForged/TokenExpired/TokenForeignMesh."""
    if not isinstance(text, str):
        raise TokenMalformed("invite token must be text")
    text = text.strip()
    if not text or len(text) > MAX_TOKEN_CHARS:
        raise TokenMalformed(f"invite token must be 1..{MAX_TOKEN_CHARS} characters, got {len(text)}")
    if not set(text) <= _B64URL or len(text) % 4 == 1:
        raise TokenMalformed("invite token is not unpadded base64url (A-Z a-z 0-9 - _)")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenMalformed("invite token is not unpadded base64url") from None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != text:
        raise TokenMalformed("invite token is not in canonical base64url form")
    try:
        envelope = open_envelope(raw, context=INVITE_CONTEXT, max_size=MAX_TOKEN_CHARS)
    except EnvelopeError as exc:
        if exc.code == "bad_signature":
            raise TokenForged(
                "invite token signature does not verify: it was altered or not issued by its key"
            ) from None
        raise TokenMalformed(f"invite token is malformed: {exc}") from None
    body = envelope.body
    if set(body) - {"uses"} != {"addrs", "exp", "mesh", "nonce"} or not isinstance(body["addrs"], list):
        raise TokenMalformed("invite token body must have exactly addrs (list), exp, mesh, nonce and optionally uses")
    token = InviteToken(
        mesh_id=body["mesh"],
        issuer_public_key=envelope.signer_public_key,
        addrs=tuple(body["addrs"]),
        expires_at=body["exp"],
        nonce=body["nonce"],
        text=text,
        uses=body.get("uses"),
    )
    if now >= token.expires_at:
        when = datetime.datetime.fromtimestamp(
            token.expires_at, datetime.timezone.utc
        ).isoformat()  # exp < now: in range
        raise TokenExpired(
            f"invite token expired at {when} ({int(now - token.expires_at)} s ago); ask a member for a new one"
        )
    if expected_mesh_id is not None and token.mesh_id != expected_mesh_id:
        raise TokenForeignMesh(f"invite token is for mesh {token.mesh_id}, not this node's mesh {expected_mesh_id}")
    return token
