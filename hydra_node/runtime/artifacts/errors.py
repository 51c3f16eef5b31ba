"""Typed artifact errors: each carries a stable ``code`` and the HTTP ``status`` the API answers with.

Who is to blame: :class:`ChecksumMismatch`, :class:`SignatureInvalid` and :class:`ManifestInvalid`
are the holder's fault (bytes that do not match what was signed, or a forged or malformed
manifest); :class:`IdentityMismatch` is a caller asking for state that is not compatible with
what it runs; :class:`ArtifactNotFound` and :class:`StoreUnavailable` describe the store.
"""

from __future__ import annotations

__all__ = [
    "ArtifactError",
    "ArtifactNotFound",
    "ChecksumMismatch",
    "IdentityMismatch",
    "InvalidRequest",
    "ManifestInvalid",
    "NamespaceTampered",
    "SignatureInvalid",
    "SourceInvalid",
    "StoreUnavailable",
    "TransferFailed",
]


class ArtifactError(Exception):
    """Base of every artifact error; ``str(exc)`` is the message for the operator."""

    code = "artifact_error"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ArtifactNotFound(ArtifactError):
    """No committed artifact of that kind and name in the store (or the peer does not hold it)."""

    code = "artifact_not_found"
    status = 404


class ChecksumMismatch(ArtifactError):
    """A file's size or sha256 differs from its manifest: the artifact is corrupt and refused."""

    code = "checksum_mismatch"
    status = 502


class SignatureInvalid(ArtifactError):
    """The manifest is unsigned, its signature does not verify, or its signer is not trusted."""

    code = "signature_invalid"
    status = 502


class IdentityMismatch(ArtifactError):
    """The artifact's compatibility identity differs from the one required, in ``fields``."""

    code = "identity_mismatch"
    status = 422

    def __init__(self, fields: list[str], message: str | None = None) -> None:
        self.fields = list(fields)
        super().__init__(message or "compatibility identity differs in: " + ", ".join(self.fields))


class StoreUnavailable(ArtifactError):
    """The store cannot be reached or written (missing root, permission, I/O error, network)."""

    code = "store_unavailable"
    status = 503


class ManifestInvalid(ArtifactError):
    """A manifest that breaks the format (protocol/placement.md): bad CBOR or JSON, a bound, a field."""

    code = "manifest_invalid"
    status = 502


class NamespaceTampered(ArtifactError):
    """A folder the store sweeps, renames or deletes in (``.staging``, ``.trash``, ``KIND``,
    ``KIND/NAME``, a version folder) is a symbolic link or not a folder: someone who can write the
    namespace planted it. The store refuses to work through it, so nothing outside the namespace
    is touched; the message names the path."""

    code = "namespace_tampered"
    status = 502


class SourceInvalid(ArtifactError):
    """What the caller asked to publish cannot be read: a missing file, a folder, a special file."""

    code = "source_invalid"
    status = 400


class TransferFailed(ArtifactError):
    """A peer's transfer broke: the link closed or stalled, or the peer broke the stream's rules."""

    code = "transfer_failed"
    status = 502


class InvalidRequest(ArtifactError):
    """The caller asked for something the format forbids: a bad kind or name, a bad file path or
    identity to publish (the same rules as a manifest's, but the caller's fault)."""

    code = "invalid_request"
    status = 400
