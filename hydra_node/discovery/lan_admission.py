"""LAN admission helpers (pure): token fingerprints and a challenge/proof exchange.

mDNS TXT records are public, so they carry only ``tok_fp``: a keyed BLAKE2b of the
mesh id under the mesh's admission secret.  Without the secret nobody can make or
test a fingerprint; with it a node checks that an advertised mesh is its own before
dialling.  The challenge/proof lets a node show it holds the secret without sending
it: ``proof = BLAKE2b(key=secret, domain ‖ mesh_id ‖ challenge)``; challenges carry a
time bucket so a captured proof goes stale.  The real admission is still the link
handshake; this only stops a node from trying (or being lured into) a stranger's mesh.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Callable

FINGERPRINT_DOMAIN = b"hydra-lan-token-fingerprint-v1\0"
PROOF_DOMAIN = b"hydra-lan-token-proof-v1\0"
FINGERPRINT_BYTES = 16  # 32 hex characters in TXT
PROOF_BYTES = 32
CHALLENGE_BUCKET_S = 300  # a challenge is valid in its 5-minute bucket and the neighbours
CHALLENGE_NONCE_BYTES = 16
MAX_SECRET = 4096  # bytes; longer secrets are a caller bug

_CHALLENGE = re.compile(r"^v1:(\d{1,12}):([0-9a-f]{32})$")

# An invite token parser: opaque token text -> (mesh_id, admission secret).
InviteParser = Callable[[str], "tuple[str, bytes]"]


class AdmissionError(Exception):
    """A challenge, proof or token is unusable."""


@dataclass(frozen=True)
class MeshSecret:
    """What a node holding an invite knows: the mesh id and its admission secret."""

    mesh_id: str
    secret: bytes

    def __post_init__(self) -> None:
        if not self.mesh_id or not isinstance(self.secret, bytes) or not 0 < len(self.secret) <= MAX_SECRET:
            raise AdmissionError("mesh id and a 1..4096-byte secret are required")

    def __repr__(self) -> str:  # never print the secret
        return f"MeshSecret(mesh_id={self.mesh_id!r}, secret=<{len(self.secret)} bytes>)"


def mesh_secret_from_invite(token: str, parser: InviteParser) -> MeshSecret:
    """Extract (mesh id, secret) with the caller's invite parser; parser errors become AdmissionError."""
    try:
        mesh_id, secret = parser(token)
    except AdmissionError:
        raise
    except Exception as exc:
        raise AdmissionError(f"invite token unreadable: {exc}") from None
    return MeshSecret(mesh_id, secret)


def _key(secret: bytes) -> bytes:
    # BLAKE2b keys are at most 64 bytes; derive a fixed-size key from any secret.
    if not isinstance(secret, bytes) or not 0 < len(secret) <= MAX_SECRET:
        raise AdmissionError("secret must be 1..4096 bytes")
    return hashlib.blake2b(secret, digest_size=32, person=b"hydra-lan-key").digest()


def token_fingerprint(secret: bytes, mesh_id: str) -> str:
    """The public fingerprint of ``mesh_id`` under ``secret`` (32 lowercase hex chars)."""
    h = hashlib.blake2b(FINGERPRINT_DOMAIN + mesh_id.encode(), key=_key(secret), digest_size=FINGERPRINT_BYTES)
    return h.hexdigest()


def fingerprint_matches(secret: bytes, mesh_id: str, fingerprint: str) -> bool:
    """True when ``fingerprint`` (from a TXT record) was made with ``secret`` for ``mesh_id``."""
    return hmac.compare_digest(token_fingerprint(secret, mesh_id), fingerprint.lower())


def may_join(advert_mesh_id: str, advert_fingerprint: str, mine: MeshSecret) -> bool:
    """A LAN advert is worth dialling only for our own mesh with a fingerprint we can reproduce."""
    return advert_mesh_id == mine.mesh_id and fingerprint_matches(mine.secret, mine.mesh_id, advert_fingerprint)


def make_challenge(nonce: bytes, now_s: float) -> str:
    """A challenge ``v1:<bucket>:<nonce hex>``; the nonce comes from the caller (``secrets.token_bytes``)."""
    if len(nonce) != CHALLENGE_NONCE_BYTES:
        raise AdmissionError(f"nonce must be {CHALLENGE_NONCE_BYTES} bytes")
    return f"v1:{int(now_s) // CHALLENGE_BUCKET_S}:{nonce.hex()}"


def make_proof(secret: bytes, mesh_id: str, challenge: str) -> str:
    """The proof that the holder of ``secret`` answers to ``challenge`` (64 lowercase hex chars)."""
    if not _CHALLENGE.match(challenge):
        raise AdmissionError("malformed challenge")
    msg = PROOF_DOMAIN + mesh_id.encode() + b"\0" + challenge.encode()
    return hashlib.blake2b(msg, key=_key(secret), digest_size=PROOF_BYTES).hexdigest()


def verify_proof(secret: bytes, mesh_id: str, challenge: str, proof: str, now_s: float) -> bool:
    """Check a proof; the challenge must be from the current bucket or a neighbour (clock skew)."""
    m = _CHALLENGE.match(challenge)
    if not m or not isinstance(proof, str):
        return False
    if abs(int(m.group(1)) - int(now_s) // CHALLENGE_BUCKET_S) > 1:
        return False
    return hmac.compare_digest(make_proof(secret, mesh_id, challenge), proof.lower())
