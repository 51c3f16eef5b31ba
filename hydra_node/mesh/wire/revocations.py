"""Invite revocation lists (sans-IO): an issuer's signed list of the token ids it no longer honours.

The list is a signed envelope (context ``invite-revocations``, the issuer's node key) whose body is::

    {"mesh": mesh_id, "revoked": [{"exp": uint, "id": bytes(16), "why": "revoked" | "used"}, ...], "ver": uint}

``id`` is a token's nonce (its id), ``exp`` that token's expiry (an entry is moot, and dropped by the
issuer, once its token expired), ``why`` is ``revoked`` (the operator revoked it) or ``used`` (a
``uses``-limited token admitted as many joiners as it allows). Entries are sorted by ``id``, each id
at most once, at most :data:`MAX_REVOCATION_ENTRIES`. ``ver`` grows with every list an issuer
publishes: a receiver keeps the newest list per issuer and rejects an older one (a replay) or another
list with the same version (an equivocation). See protocol/README.md section 6.1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import nacl.signing

from hydra_node.mesh.wire.envelope import open_envelope, seal
from hydra_node.mesh.wire.errors import EnvelopeError, LocalProtocolError, RemoteProtocolError
from hydra_node.mesh.wire.ids import is_mesh_id, node_id_from_public_key
from hydra_node.mesh.wire.token import NONCE_BYTES

__all__ = [
    "MAX_REVOCATION_ENTRIES",
    "MAX_REVOCATION_LIST_BYTES",
    "MAX_REVOCATION_VERSION",
    "REASONS",
    "REVOCATIONS_CONTEXT",
    "Revocation",
    "RevocationList",
    "RevocationRejected",
    "open_revocations",
    "seal_revocations",
]

REVOCATIONS_CONTEXT = "invite-revocations"
#: Entries in one list: a token lives at most 30 days, so this is plenty of live revocations per issuer.
MAX_REVOCATION_ENTRIES = 256
#: A list's envelope (256 entries of ~40 bytes, plus the envelope), so a receiver decodes a bounded map.
MAX_REVOCATION_LIST_BYTES = 12 * 1024
#: Versions are unsigned 63-bit (the issuer starts from the unix time, so a lost record file still moves on).
MAX_REVOCATION_VERSION = 2**63 - 1
REASONS = ("revoked", "used")


class RevocationRejected(RemoteProtocolError):
    """A revocation list we refuse. Codes: ``malformed``, ``forged``, ``foreign_mesh`` (decoding);
    ``stale``, ``equivocation``, ``not_member``, ``table_full`` (against what we hold)."""

    code = "revocations"


@dataclass(frozen=True, order=True)
class Revocation:
    """One revoked token: its id (the nonce), its expiry, and why."""

    token_id: bytes
    expires_at: int
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.token_id, bytes) or len(self.token_id) != NONCE_BYTES:
            raise ValueError(f"a revoked token id is {NONCE_BYTES} bytes")
        if (
            isinstance(self.expires_at, bool)
            or not isinstance(self.expires_at, int)
            or not 0 <= self.expires_at < 2**63
        ):
            raise ValueError("a revocation's exp is unix seconds")
        if self.reason not in REASONS:
            raise ValueError(f"a revocation's why is one of {', '.join(REASONS)}")

    def to_wire(self) -> dict[str, object]:
        return {"exp": self.expires_at, "id": self.token_id, "why": self.reason}


@dataclass(frozen=True)
class RevocationList:
    """A verified list: who signed it, for which mesh, which version, which tokens."""

    issuer_public_key: bytes
    mesh_id: str
    version: int
    entries: tuple[Revocation, ...]
    raw: bytes = field(repr=False)

    @property
    def issuer_id(self) -> str:
        return node_id_from_public_key(self.issuer_public_key)

    def reason_for(self, token_id: bytes, now: float) -> str | None:
        """Why the token is refused (None: this list does not name it, or the entry expired)."""
        for entry in self.entries:
            if entry.token_id == token_id and now < entry.expires_at:
                return entry.reason
        return None


def _check_entries(entries: tuple[Revocation, ...]) -> None:
    if len(entries) > MAX_REVOCATION_ENTRIES:
        raise ValueError(f"at most {MAX_REVOCATION_ENTRIES} revocations per list")
    ids = [e.token_id for e in entries]
    if ids != sorted(set(ids)):
        raise ValueError("revocations are sorted by id, each id once")


def seal_revocations(
    signing_key: nacl.signing.SigningKey, mesh_id: str, version: int, entries: list[Revocation] | tuple[Revocation, ...]
) -> bytes:
    """The signed list (entries are sorted here); LocalProtocolError for what the spec forbids."""
    entries = tuple(sorted(entries, key=lambda e: e.token_id))
    if not is_mesh_id(mesh_id):
        raise LocalProtocolError(f"{mesh_id!r} is not a mesh id")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_REVOCATION_VERSION:
        raise LocalProtocolError("a revocation list version is 1..2^63-1")
    try:
        _check_entries(entries)
    except ValueError as exc:
        raise LocalProtocolError(str(exc)) from None
    raw = seal(
        signing_key, REVOCATIONS_CONTEXT, {"mesh": mesh_id, "revoked": [e.to_wire() for e in entries], "ver": version}
    )
    if len(raw) > MAX_REVOCATION_LIST_BYTES:
        raise LocalProtocolError(f"revocation list would exceed {MAX_REVOCATION_LIST_BYTES} bytes")
    return raw


def open_revocations(raw: bytes, *, expected_mesh_id: str) -> RevocationList:
    """Verify and decode a list, or raise RevocationRejected (malformed, forged, foreign_mesh)."""
    if not isinstance(raw, bytes) or len(raw) > MAX_REVOCATION_LIST_BYTES:
        raise RevocationRejected(f"a revocation list is at most {MAX_REVOCATION_LIST_BYTES} bytes", code="malformed")
    try:
        env = open_envelope(raw, context=REVOCATIONS_CONTEXT, max_size=MAX_REVOCATION_LIST_BYTES)
    except EnvelopeError as exc:
        code = "forged" if exc.code == "bad_signature" else "malformed"
        raise RevocationRejected(f"revocation list envelope: {exc}", code=code) from None
    body = env.body
    if set(body) != {"mesh", "revoked", "ver"} or not isinstance(body["revoked"], list):
        raise RevocationRejected("revocation list body must be exactly {mesh, revoked (list), ver}", code="malformed")
    version = body["ver"]
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_REVOCATION_VERSION:
        raise RevocationRejected("revocation list ver must be 1..2^63-1", code="malformed")
    if not isinstance(body["mesh"], str) or not is_mesh_id(body["mesh"]):
        raise RevocationRejected("revocation list mesh is not a mesh id", code="malformed")
    try:
        entries = []
        for item in body["revoked"]:
            if not isinstance(item, dict) or set(item) != {"exp", "id", "why"}:
                raise ValueError("each revocation is exactly {exp, id, why}")
            entries.append(Revocation(item["id"], item["exp"], item["why"]))
        _check_entries(tuple(entries))
    except ValueError as exc:
        raise RevocationRejected(f"revocation list entries: {exc}", code="malformed") from None
    if body["mesh"] != expected_mesh_id:
        raise RevocationRejected("revocation list is for another mesh", code="foreign_mesh")
    return RevocationList(env.signer_public_key, body["mesh"], version, tuple(entries), raw)
