"""Artifact manifests (sans-IO): what an artifact holds, who published it, signed (protocol/placement.md).

A manifest names an artifact (``kind``, ``name``), lists every file with its size and sha256,
carries the compatibility identity (an opaque canonical-CBOR map; exact for KV state), the
provider location, the creation time and the publishing node's id, and the node's Ed25519
signature over the domain-separated canonical CBOR of every other field::

    signed = b"hydra/1/artifact-manifest\\x00" || CBOR({"created_at", "files": [{"path", "sha256",
             "size"}, ...], "identity", "kind", "location", "name", "node", "v": 1})
    wire   = CBOR({...the same fields..., "sig": bytes(64)})

The wire form is decoded by ``hydra_node.codec`` (the one decoder of untrusted bytes); the JSON
form is the same map for humans and shared-namespace readers (byte strings as ``{"bytes": hex}``,
as in protocol/vectors). ``manifest_id`` is the sha256 hex of the signed body.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing

from hydra_node.codec import cbor
from hydra_node.codec.errors import DecodeError, EncodeError
from hydra_node.mesh.wire.envelope import signing_input
from hydra_node.mesh.wire.ids import is_node_id, node_id_from_public_key
from hydra_node.runtime.artifacts.errors import ManifestInvalid, SignatureInvalid

__all__ = [
    "HASH_BUFFER_BYTES",
    "KINDS",
    "MANIFEST_CONTEXT",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_IDENTITY_BYTES",
    "MAX_IDENTITY_KEYS",
    "MAX_LOCATION_CHARS",
    "MAX_MANIFEST_BYTES",
    "MAX_NAME_CHARS",
    "MAX_PATH_CHARS",
    "SCHEMA_VERSION",
    "ArtifactFile",
    "Manifest",
    "hash_file",
    "signer",
    "validate_kind",
    "validate_name",
    "validate_path",
]

KINDS = ("model_weights", "layer_package", "kv_state", "recurrent_state", "activation_frames")
SCHEMA_VERSION = 1
#: Signing context (protocol/README.md section 3): the signature of a manifest is never valid elsewhere.
MANIFEST_CONTEXT = "artifact-manifest"
#: Files in one artifact (a layer package of per-tensor files stays far below).
MAX_FILES = 4096
#: One file's size: 1 TiB, as for shared model files (runtime/fetch/peer_wire.py).
MAX_FILE_BYTES = 1 << 40
#: An artifact name: one path segment on a POSIX root and in an S3 key.
MAX_NAME_CHARS = 128
#: A file's relative path (characters), and one of its segments (bytes, the POSIX NAME_MAX).
MAX_PATH_CHARS = 512
MAX_SEGMENT_BYTES = 255
#: Top-level keys of the compatibility identity, and its encoded size (a 64k-token prefix of
#: packed token ids is 256 KiB).
MAX_IDENTITY_KEYS = 64
MAX_IDENTITY_BYTES = 512 * 1024
#: A provider location ("posix:/abs/root" or "s3://bucket/prefix").
MAX_LOCATION_CHARS = 1024
#: A whole encoded manifest: 4096 files of the longest path plus the largest identity fit.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: Read size when hashing a file.
HASH_BUFFER_BYTES = 4 * 1024 * 1024

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+:-]*")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_WIRE_KEYS = frozenset({"created_at", "files", "identity", "kind", "location", "name", "node", "sig", "v"})
_FILE_KEYS = frozenset({"path", "sha256", "size"})


def _uint(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def validate_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise ManifestInvalid(f"artifact kind {kind!r:.40} is not one of {', '.join(KINDS)}")
    return kind


def validate_name(name: Any) -> str:
    """An artifact name: 1–128 of ``A-Z a-z 0-9 . _ @ + : -``, starting with a letter or digit."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise ManifestInvalid(
            f"artifact name {name!r:.140} must be 1–{MAX_NAME_CHARS} characters of "
            "A-Z a-z 0-9 . _ @ + : - starting with a letter or digit"
        )
    return name


def validate_path(path: Any) -> str:
    """A file's path inside an artifact: relative, '/'-separated, no empty, '.' or '..' segment."""
    if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH_CHARS:
        raise ManifestInvalid(f"a file path is 1–{MAX_PATH_CHARS} characters")
    if any(ord(c) < 0x20 or c in "\\\x7f" for c in path):
        raise ManifestInvalid(f"file path {path!r:.80} holds a control character or a backslash")
    for segment in path.split("/"):
        if segment in ("", ".", "..") or len(segment.encode()) > MAX_SEGMENT_BYTES:
            raise ManifestInvalid(
                f"file path {path!r:.80} must be relative, '/'-separated, without empty, "
                f"'.' or '..' segments, each at most {MAX_SEGMENT_BYTES} bytes"
            )
    return path


def _validate_location(location: Any) -> str:
    if not isinstance(location, str) or len(location) > MAX_LOCATION_CHARS:
        raise ManifestInvalid(f"a location is text of at most {MAX_LOCATION_CHARS} characters")
    if not (location.startswith("posix:/") or (location.startswith("s3://") and len(location) > 5)):
        raise ManifestInvalid(f"location {location!r:.80} is neither posix:/ABSOLUTE/ROOT nor s3://BUCKET/PREFIX")
    return location


def _check_identity_value(value: Any) -> None:
    if isinstance(value, dict):
        if set(value) == {"bytes"}:  # the JSON form writes a byte string as {"bytes": hex}
            raise ManifestInvalid("an identity map may not have 'bytes' as its only key (the JSON form of bytes)")
        for item in value.values():
            _check_identity_value(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_identity_value(item)


def _validate_identity(identity: Any) -> dict[str, Any]:
    if not isinstance(identity, Mapping) or not all(isinstance(k, str) for k in identity):
        raise ManifestInvalid("the compatibility identity is a map with text keys")
    identity = dict(identity)
    if len(identity) > MAX_IDENTITY_KEYS:
        raise ManifestInvalid(f"the compatibility identity has at most {MAX_IDENTITY_KEYS} keys")
    try:
        encoded = cbor.encode({"identity": identity})  # at its depth inside the manifest
    except EncodeError as exc:
        raise ManifestInvalid(f"the compatibility identity is not canonical-CBOR data: {exc}") from None
    if len(encoded) > MAX_IDENTITY_BYTES:
        raise ManifestInvalid(
            f"the compatibility identity encodes to {len(encoded)} bytes; at most {MAX_IDENTITY_BYTES}"
        )
    _check_identity_value(identity)
    return cbor.decode(encoded, max_size=MAX_IDENTITY_BYTES + 16)["identity"]  # tuples become lists, as on the wire


@dataclass(frozen=True, order=True)
class ArtifactFile:
    """One file of an artifact: its relative path, size and sha256 (64 lower-case hex digits)."""

    path: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        validate_path(self.path)
        if not _uint(self.size, MAX_FILE_BYTES):
            raise ManifestInvalid(f"file {self.path!r:.80}: size must be an integer 0 … {MAX_FILE_BYTES}")
        if not isinstance(self.sha256, str) or not _HEX64.fullmatch(self.sha256):
            raise ManifestInvalid(f"file {self.path!r:.80}: sha256 must be 64 lower-case hex digits")

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class Manifest:
    """A (possibly unsigned) manifest; valid by construction (:class:`ManifestInvalid` otherwise).

    ``files`` is kept sorted by path; an unsigned manifest has ``node_id == ""`` and no signature
    until :meth:`sign`, which fills both."""

    kind: str
    name: str
    files: tuple[ArtifactFile, ...]
    identity: Mapping[str, Any]
    location: str
    created_at: int
    node_id: str = ""
    signature: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        validate_kind(self.kind)
        validate_name(self.name)
        files = tuple(self.files) if isinstance(self.files, (list, tuple)) else None
        if files is None or not 0 < len(files) <= MAX_FILES or not all(isinstance(f, ArtifactFile) for f in files):
            raise ManifestInvalid(f"an artifact lists 1 … {MAX_FILES} files")
        files = tuple(sorted(files))
        paths = [f.path for f in files]
        for before, after in itertools.pairwise(paths):
            if before == after or after.startswith(before + "/"):
                raise ManifestInvalid(f"file path {after!r:.80} repeats or lies under the file {before!r:.80}")
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "identity", _validate_identity(self.identity))
        _validate_location(self.location)
        if not _uint(self.created_at, 2**63 - 1):
            raise ManifestInvalid("created_at is unix seconds (an integer ≥ 0)")
        if self.node_id == "" and self.signature == b"":
            return
        if not is_node_id(self.node_id):
            raise ManifestInvalid("node_id must be a node id (64 lower-case hex digits)")
        if not isinstance(self.signature, bytes) or len(self.signature) not in (0, 64):
            raise ManifestInvalid("a signature is 64 bytes")

    def __hash__(self) -> int:  # the identity map is a dict: hash what names the content
        return hash((self.kind, self.name, self.files, self.node_id, self.signature))

    # ---- derived -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Bytes of every file together."""
        return sum(f.size for f in self.files)

    @property
    def signed(self) -> bool:
        return bool(self.signature)

    def body(self) -> dict[str, Any]:
        """The signed map: every field but the signature."""
        return {
            "created_at": self.created_at,
            "files": [f.to_wire() for f in self.files],
            "identity": dict(self.identity),
            "kind": self.kind,
            "location": self.location,
            "name": self.name,
            "node": self.node_id,
            "v": SCHEMA_VERSION,
        }

    def body_bytes(self) -> bytes:
        return cbor.encode(self.body())

    @property
    def manifest_id(self) -> str:
        """sha256 hex of the signed body (the same for a manifest before and after signing by one node)."""
        return hashlib.sha256(self.body_bytes()).hexdigest()

    def file(self, path: str) -> ArtifactFile | None:
        return next((f for f in self.files if f.path == path), None)

    # ---- signing ---------------------------------------------------------------------------
    def sign(self, signing_key: nacl.signing.SigningKey) -> Manifest:
        """This manifest published by ``signing_key``'s node, signed."""
        unsigned = replace(self, node_id=node_id_from_public_key(bytes(signing_key.verify_key)), signature=b"")
        signature = signing_key.sign(signing_input(MANIFEST_CONTEXT, unsigned.body_bytes())).signature
        return replace(unsigned, signature=signature)

    def verify(self) -> None:
        """:class:`SignatureInvalid` unless the signature verifies against ``node_id``'s public key."""
        if not self.signature:
            raise SignatureInvalid(f"manifest of {self.kind}/{self.name} is not signed")
        try:
            key = nacl.signing.VerifyKey(bytes.fromhex(self.node_id))
            key.verify(signing_input(MANIFEST_CONTEXT, self.body_bytes()), self.signature)
        except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, nacl.exceptions.TypeError, ValueError):
            raise SignatureInvalid(
                f"the signature of {self.kind}/{self.name} does not verify against its node {self.node_id[:16]}"
            ) from None

    # ---- wire and JSON forms ----------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        if not self.signature:
            raise SignatureInvalid("only a signed manifest has a wire form; sign it first")
        return {**self.body(), "sig": self.signature}

    def to_cbor(self) -> bytes:
        return cbor.encode(self.to_wire())

    @classmethod
    def from_wire(cls, wire: Any) -> Manifest:
        """The manifest of a decoded map (not yet verified: call :meth:`verify`)."""
        if not isinstance(wire, dict) or set(wire) != _WIRE_KEYS:
            raise ManifestInvalid("a manifest is a map of exactly " + ", ".join(sorted(_WIRE_KEYS)))
        if wire["v"] != SCHEMA_VERSION or isinstance(wire["v"], bool):
            raise ManifestInvalid(
                f"manifest schema version {wire['v']!r:.20}; this node reads version {SCHEMA_VERSION}"
            )
        files = wire["files"]
        if not isinstance(files, list) or len(files) > MAX_FILES:
            raise ManifestInvalid(f"manifest files is a list of at most {MAX_FILES} entries")
        if not all(isinstance(f, dict) and set(f) == _FILE_KEYS for f in files):
            raise ManifestInvalid("each file is a map of exactly path, sha256, size")
        paths = [f["path"] for f in files]
        if not all(isinstance(p, str) for p in paths) or paths != sorted(set(paths)):
            raise ManifestInvalid("manifest files are sorted by path, each path once")
        if not isinstance(wire["sig"], bytes) or len(wire["sig"]) != 64:
            raise ManifestInvalid("a manifest's sig is 64 bytes")
        if not isinstance(wire["node"], str) or not is_node_id(wire["node"]):
            raise ManifestInvalid("a manifest's node is a node id (64 lower-case hex digits)")
        return cls(
            wire["kind"],
            wire["name"],
            tuple(ArtifactFile(f["path"], f["size"], f["sha256"]) for f in files),
            wire["identity"],
            wire["location"],
            wire["created_at"],
            wire["node"],
            wire["sig"],
        )

    @classmethod
    def from_cbor(cls, data: bytes) -> Manifest:
        try:
            wire = cbor.decode(data, max_size=MAX_MANIFEST_BYTES)
        except DecodeError as exc:
            raise ManifestInvalid(f"manifest is not canonical CBOR ({exc.code}): {exc}") from None
        return cls.from_wire(wire)

    def to_json(self) -> str:
        """The JSON form (bytes as ``{"bytes": hex}``), with ``manifest_id`` and ``size`` for readers."""
        doc = {**_to_json(self.to_wire()), "manifest_id": self.manifest_id, "size": self.size}
        return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        if len(text) > 3 * MAX_MANIFEST_BYTES:
            raise ManifestInvalid(f"a JSON manifest is at most {3 * MAX_MANIFEST_BYTES} bytes")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ManifestInvalid(f"manifest is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ManifestInvalid("a JSON manifest is an object")
        derived = {k: doc.pop(k, None) for k in ("manifest_id", "size")}
        try:
            manifest = cls.from_wire(_from_json(doc, 0))
        except RecursionError:
            raise ManifestInvalid("a JSON manifest nests too deeply") from None
        if derived != {"manifest_id": manifest.manifest_id, "size": manifest.size}:
            raise ManifestInvalid("the JSON manifest's manifest_id or size does not match its fields")
        return manifest


def _to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any, depth: int) -> Any:
    if depth > cbor.MAX_DEPTH:
        raise ManifestInvalid(f"a JSON manifest nests at most {cbor.MAX_DEPTH} deep")
    if isinstance(value, dict):
        if set(value) == {"bytes"}:
            try:
                return bytes.fromhex(value["bytes"])
            except (TypeError, ValueError):
                raise ManifestInvalid("a {\"bytes\": …} value must hold hex digits") from None
        return {k: _from_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v, depth + 1) for v in value]
    return value


def hash_file(path: Path | str) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in :data:`HASH_BUFFER_BYTES` chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(HASH_BUFFER_BYTES)
        view = memoryview(buf)
        while n := f.readinto(buf):
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


def signer(signing_key: nacl.signing.SigningKey) -> Callable[[Manifest], Manifest]:
    """The ``sign`` callable a store's ``publish`` takes, for this node's key."""
    return lambda manifest: manifest.sign(signing_key)
