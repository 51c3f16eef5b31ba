"""Artifacts: signed manifests, stores that publish and fetch them atomically, transfer between peers.

* :mod:`.manifest` — :class:`Manifest`, :class:`ArtifactFile`, ``KINDS``; canonical CBOR and JSON
  forms, Ed25519 signature (protocol/placement.md).
* :mod:`.errors` — :class:`ArtifactError` and its typed subclasses (stable ``code``, HTTP ``status``).
* :mod:`.store` — the :class:`ArtifactStore` protocol, :class:`StagedDirectory`, :func:`crash_point`.
* :mod:`.filecopy` — copy a file and sha256 the copy in one pass.
* :mod:`.posix` — :class:`PosixStore` (a folder, NFS or VAST mount).
* :mod:`.peer` — the ``artifact_fetch`` stream: :class:`ArtifactShare` and :func:`fetch_from_peer`.
"""

from __future__ import annotations

from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    ArtifactNotFound,
    ChecksumMismatch,
    IdentityMismatch,
    InvalidRequest,
    ManifestInvalid,
    NamespaceTampered,
    SignatureInvalid,
    SourceInvalid,
    StoreUnavailable,
    TransferFailed,
)
from hydra_node.runtime.artifacts.manifest import (
    KINDS,
    ArtifactFile,
    Manifest,
    hash_file,
    signer,
    validate_name,
)
from hydra_node.runtime.artifacts.posix import PosixStore
from hydra_node.runtime.artifacts.store import (
    ArtifactStore,
    StagedDirectory,
    crash_point,
)

__all__ = [
    "KINDS",
    "ArtifactError",
    "ArtifactFile",
    "ArtifactNotFound",
    "ArtifactStore",
    "ChecksumMismatch",
    "IdentityMismatch",
    "InvalidRequest",
    "Manifest",
    "ManifestInvalid",
    "NamespaceTampered",
    "PosixStore",
    "SignatureInvalid",
    "SourceInvalid",
    "StagedDirectory",
    "StoreUnavailable",
    "TransferFailed",
    "crash_point",
    "hash_file",
    "signer",
    "validate_name",
]
