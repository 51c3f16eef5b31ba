"""Signed envelopes: Ed25519 over the exact body bytes, domain-separated (sans-IO).

Wire form (canonical CBOR map)::

    {"body": bytes, "ctx": text, "gen": uint, "key": bytes(32), "sig": bytes(64)}

`sig` is Ed25519 by `key` over ``b"hydra/<gen>/<ctx>\\x00" || body``; `body` is the
canonical CBOR of a map. The verifier checks the signature over the bytes it
received and only then decodes `body`; nothing is re-encoded to verify.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import nacl.exceptions
import nacl.signing

from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.constants import PROTOCOL_GENERATION
from hydra_node.mesh.wire.errors import CborError, EnvelopeError, LocalProtocolError
from hydra_node.mesh.wire.ids import node_id_from_public_key

MAX_CONTEXT_CHARS = 64


def signing_input(context: str, body: bytes, generation: int = PROTOCOL_GENERATION) -> bytes:
    """The exact bytes signed for `body` under `context`."""
    return f"hydra/{generation}/{context}".encode() + b"\x00" + body


def _check_context(context: str) -> None:
    if not context or len(context) > MAX_CONTEXT_CHARS or not context.isascii() or "\x00" in context:
        raise LocalProtocolError(f"bad signing context {context!r}")


@dataclass(frozen=True)
class SignedEnvelope:
    """A verified envelope: who signed which body under which context."""

    context: str
    signer_public_key: bytes
    body: dict[str, Any]
    body_bytes: bytes = field(repr=False)
    raw: bytes = field(repr=False)

    @property
    def signer_id(self) -> str:
        return node_id_from_public_key(self.signer_public_key)


def seal(signing_key: nacl.signing.SigningKey, context: str, body: dict[str, Any]) -> bytes:
    """Sign `body` under `context` and return the envelope bytes."""
    _check_context(context)
    if not isinstance(body, dict):
        raise LocalProtocolError("an envelope body is a map")
    body_bytes = cbor.encode(body)
    signature = signing_key.sign(signing_input(context, body_bytes)).signature
    return cbor.encode(
        {
            "body": body_bytes,
            "ctx": context,
            "gen": PROTOCOL_GENERATION,
            "key": bytes(signing_key.verify_key),
            "sig": signature,
        }
    )


def open_envelope(data: bytes, *, context: str | None = None, max_size: int = cbor.DEFAULT_MAX_SIZE) -> SignedEnvelope:
    """Verify and decode an envelope, or raise EnvelopeError (code names the defect)."""
    try:
        outer = cbor.decode(data, max_size=max_size)
    except CborError as exc:
        raise EnvelopeError(f"envelope is not canonical CBOR: {exc}", code="bad_cbor") from None
    if not isinstance(outer, dict) or set(outer) != {"body", "ctx", "gen", "key", "sig"}:
        raise EnvelopeError("envelope must be a map with exactly body, ctx, gen, key, sig", code="malformed")
    gen, ctx, key, sig, body_bytes = outer["gen"], outer["ctx"], outer["key"], outer["sig"], outer["body"]
    if gen != PROTOCOL_GENERATION or isinstance(gen, bool):
        raise EnvelopeError(
            f"envelope of protocol generation {gen!r}; this node speaks generation {PROTOCOL_GENERATION}",
            code="generation_mismatch",
        )
    if not isinstance(ctx, str) or not isinstance(body_bytes, bytes):
        raise EnvelopeError("envelope ctx must be text and body bytes", code="malformed")
    if not isinstance(key, bytes) or len(key) != 32 or not isinstance(sig, bytes) or len(sig) != 64:
        raise EnvelopeError("envelope key must be 32 bytes and sig 64 bytes", code="malformed")
    if context is not None and ctx != context:
        raise EnvelopeError(f"envelope signed for context {ctx!r}, expected {context!r}", code="wrong_context")
    try:
        nacl.signing.VerifyKey(key).verify(signing_input(ctx, body_bytes), sig)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, nacl.exceptions.TypeError):
        raise EnvelopeError("envelope signature does not verify", code="bad_signature") from None
    try:
        body = cbor.decode(body_bytes, max_size=max_size)
    except CborError as exc:
        raise EnvelopeError(f"envelope body is not canonical CBOR: {exc}", code="bad_cbor") from None
    if not isinstance(body, dict):
        raise EnvelopeError("envelope body must be a map", code="malformed")
    return SignedEnvelope(context=ctx, signer_public_key=key, body=body, body_bytes=body_bytes, raw=bytes(data))
