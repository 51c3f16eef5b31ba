"""The ``artifact_fetch`` stream's messages (protocol/placement.md section 4), pure and strict.

OPEN header ``{"kind": "artifact_fetch", "artifact": KIND, "name": NAME}``, with an optional
``"offset": N`` (an integer 1 … the file's size, only for an artifact of one file: the holder
sends that file's bytes from N on, so a broken transfer resumes; absent means 0, and a
requester never sends ``offset: 0``, so a holder of the previous generation understands every
request that does not resume). The holder answers
with frames (protocol/README.md section 2.1, at most :data:`MAX_ARTIFACT_FRAME_BYTES`):
``{"op": "manifest", "m": BYTES}`` (the signed manifest's canonical CBOR), then for each file
in the manifest's order its bytes as ``{"op": "data", "b": BYTES}`` frames (1 … 64 KiB, never
spanning two files; none for an empty file), then ``{"op": "end"}``, and half-closes; or, at
any point before the end, one ``{"op": "error", "code", "message"}``.

Data frames, error codes and the per-frame payload bound are those of ``model_fetch``
(``runtime/fetch/peer_wire.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra_node.mesh.membership.announcement import MAX_EXTRA_ITEMS
from hydra_node.runtime.artifacts.errors import ArtifactError
from hydra_node.runtime.artifacts.manifest import (
    MAX_FILE_BYTES,
    MAX_MANIFEST_BYTES,
    ArtifactFile,
    Manifest,
    validate_kind,
    validate_name,
)
from hydra_node.runtime.fetch.peer_wire import DATA_FRAME_BYTES, ERROR_CODES, WireError

__all__ = [
    "ARTIFACT_FETCH_KIND",
    "HELD_ARTIFACTS_KEY",
    "LATER_EXTRA_ITEMS",
    "MAX_ANNOUNCED_ARTIFACTS",
    "MAX_ANNOUNCED_MODEL_ARTIFACTS",
    "MODEL_DIGEST_PREFIX",
    "OffsetInvalid",
    "MAX_ARTIFACT_FRAME_BYTES",
    "ArtifactReplyChecker",
    "ArtifactRequest",
    "WireError",
    "extra_items",
    "held_artifacts_extra",
    "held_artifacts_from_extra",
    "merge_held_extras",
    "model_artifact_name",
    "model_digest_of",
]

ARTIFACT_FETCH_KIND = "artifact_fetch"
#: Largest frame on the stream: the manifest frame (a data frame is 64 KiB plus its envelope).
MAX_ARTIFACT_FRAME_BYTES = MAX_MANIFEST_BYTES + 1024
#: Announcement ``extra`` key listing the artifacts a node shares: ``[[kind, name, manifest_id], ...]``.
HELD_ARTIFACTS_KEY = "artifacts_held"
#: Most artifacts one announcement lists (each costs 4 of the 256 ``extra`` items).
MAX_ANNOUNCED_ARTIFACTS = 16
#: Most cached models (``model_weights`` named ``sha256:HEX``) listed after them (docs/models.md):
#: 4 items each, so the model cache's 16 ``models_held`` entries, 16 placement artifacts and these
#: stay within the announcement's 256 ``extra`` items with room for the other services.
MAX_ANNOUNCED_MODEL_ARTIFACTS = 8
#: A cached model offered through ``artifact_fetch`` is the ``model_weights`` artifact named
#: ``sha256:`` + its file's sha256 (content-addressed: one file, that digest). Placement never
#: publishes nor caches a ``model_weights`` name of this form (``model_digest_of``).
MODEL_DIGEST_PREFIX = "sha256:"
#: ``extra`` items kept free for what is added to the announcement after the services' entries
#: (the relay agent's ``reach``/``relay``/``relays``, the signature): cached models in
#: ``artifacts_held`` never take them.
LATER_EXTRA_ITEMS = 32

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MODEL_NAME = re.compile(r"sha256:([0-9a-f]{64})")


def model_artifact_name(sha256: str) -> str:
    """The artifact name of the cached model file whose sha256 is ``sha256``."""
    if not isinstance(sha256, str) or not _HEX64.fullmatch(sha256):
        raise WireError("sha256 must be 64 lower-case hex digits")
    return MODEL_DIGEST_PREFIX + sha256


def model_digest_of(kind: str, name: str) -> str | None:
    """The sha256 a ``model_weights`` name ``sha256:HEX`` addresses (a model-cache file), or None
    for every other artifact (placement's)."""
    match = _MODEL_NAME.fullmatch(name) if kind == "model_weights" and isinstance(name, str) else None
    return match.group(1) if match else None


class OffsetInvalid(WireError):
    """A request's ``offset`` is not an integer 1 … 1 TiB (the holder answers ``bad_request``)."""


def _check_offset(offset: Any) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_FILE_BYTES:
        raise OffsetInvalid(f"offset must be an integer 0 … {MAX_FILE_BYTES}")
    return offset


@dataclass(frozen=True)
class ArtifactRequest:
    kind: str
    name: str
    #: Resume the artifact's one file from this byte (0: the whole artifact).
    offset: int = 0

    def __post_init__(self) -> None:
        try:
            validate_kind(self.kind)
            validate_name(self.name)
        except ArtifactError as exc:
            raise WireError(exc.message) from None
        _check_offset(self.offset)

    def header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"kind": ARTIFACT_FETCH_KIND, "artifact": self.kind, "name": self.name}
        if self.offset:
            header["offset"] = self.offset
        return header

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> ArtifactRequest:
        keys = set(header)
        if keys not in ({"kind", "artifact", "name"}, {"kind", "artifact", "name", "offset"}) or (
            header.get("kind") != ARTIFACT_FETCH_KIND
        ):
            raise WireError("an artifact_fetch header is exactly {kind, artifact, name} and an optional offset")
        if "offset" in header and (_check_offset(header["offset"]) == 0):
            raise OffsetInvalid("offset 0 is sent as no offset (the header without it)")
        return cls(header["artifact"], header["name"], header.get("offset", 0))


class ArtifactReplyChecker:
    """Checks a holder's frames in order. :meth:`feed` returns ``(file, bytes)`` for a data frame
    (``(None, b"")`` for the others); :attr:`manifest` is set by the first frame (decoded, not yet
    verified); :attr:`error` holds the holder's ``(code, message)``; anything out of place raises
    :class:`WireError` (or the manifest's :class:`ManifestInvalid`). With an ``offset`` (the
    request's), the manifest must list one file of at least that size, whose bytes from the offset on follow."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = _check_offset(offset)
        self.manifest: Manifest | None = None
        self.ended = False
        self.error: tuple[str, str] | None = None
        self._index = 0  # the file being received
        self._left = 0  # its bytes still to come

    @property
    def current(self) -> ArtifactFile | None:
        files = self.manifest.files if self.manifest else ()
        return files[self._index] if self._index < len(files) else None

    def _advance(self) -> None:
        """Move past the files whose bytes have all come (empty files included)."""
        assert self.manifest is not None  # called once the manifest came
        files = self.manifest.files
        while self._index < len(files) and self._left == 0:
            self._index += 1
            if self._index < len(files):
                self._left = files[self._index].size

    def feed(self, msg: Mapping[str, Any]) -> tuple[ArtifactFile | None, bytes]:
        op = msg.get("op")
        if self.ended or self.error is not None:
            raise WireError(f"{op!r:.20} after the end of the reply")
        if op == "error":
            code, message = msg.get("code"), msg.get("message")
            if set(msg) != {"op", "code", "message"} or code not in ERROR_CODES or not isinstance(message, str):
                raise WireError("a malformed error message")
            self.error = (code, message[:500])
            return None, b""
        if self.manifest is None:
            if op != "manifest" or set(msg) != {"op", "m"} or not isinstance(msg["m"], bytes):
                raise WireError("the reply must start with {op: manifest, m: bytes}")
            manifest = Manifest.from_cbor(msg["m"])
            if self.offset and (len(manifest.files) != 1 or self.offset > manifest.files[0].size):
                raise WireError(f"offset {self.offset} asked, but the manifest is not one file of at least that size")
            self.manifest = manifest
            self._left = manifest.files[0].size - self.offset
            self._advance()
            return None, b""
        if op == "data":
            data = msg.get("b")
            if set(msg) != {"op", "b"} or not isinstance(data, bytes) or not 0 < len(data) <= DATA_FRAME_BYTES:
                raise WireError("a data frame carries 1 … 64 KiB of bytes")
            file = self.current
            if file is None or len(data) > self._left:
                raise WireError("the holder sent more bytes than the manifest's files hold (or across a file end)")
            self._left -= len(data)
            self._advance()
            return file, data
        if op == "end" and set(msg) == {"op"}:
            if self.current is not None:
                raise WireError(f"end before all of {self.current.path!r:.80} was sent")
            self.ended = True
            return None, b""
        raise WireError(f"unexpected {op!r:.20} in an artifact_fetch reply")


def held_artifacts_extra(manifests: list[Manifest]) -> dict[str, Any]:
    """The announcement ``extra`` entry for the artifacts we share (the first 16), or {}."""
    items = [[m.kind, m.name, m.manifest_id] for m in manifests[:MAX_ANNOUNCED_ARTIFACTS]]
    return {HELD_ARTIFACTS_KEY: items} if items else {}


def extra_items(value: Any) -> int:
    """Items ``value`` costs in an announcement's ``extra`` (each value and container, keys free),
    as ``mesh/membership/announcement.py`` counts them against ``MAX_EXTRA_ITEMS``."""
    if isinstance(value, Mapping):
        return 1 + sum(extra_items(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return 1 + sum(extra_items(v) for v in value)
    return 1


def merge_held_extras(
    others: Mapping[str, Any], *, placement: Mapping[str, Any], models: Mapping[str, Any]
) -> dict[str, Any]:
    """The announcement ``extra``: ``others``, placement's and the model cache's entries, with one
    ``artifacts_held`` list (a ``**`` merge would keep only one of the two): the placement
    artifacts first, then as many cached models as fit in ``MAX_EXTRA_ITEMS`` less
    :data:`LATER_EXTRA_ITEMS` (entries added after this, such as the relay's and the signature)."""
    merged = {**others, **models, **placement}
    listed = list(placement.get(HELD_ARTIFACTS_KEY, []))[:MAX_ANNOUNCED_ARTIFACTS]
    merged.pop(HELD_ARTIFACTS_KEY, None)
    room = MAX_EXTRA_ITEMS - LATER_EXTRA_ITEMS - sum(extra_items(v) for v in merged.values()) - 1
    room -= sum(extra_items(item) for item in listed)
    for item in list(models.get(HELD_ARTIFACTS_KEY, []))[:MAX_ANNOUNCED_MODEL_ARTIFACTS]:
        if extra_items(item) > room:
            break
        listed.append(item)
        room -= extra_items(item)
    if listed:
        merged[HELD_ARTIFACTS_KEY] = listed
    return merged


def held_artifacts_from_extra(extra: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(kind, name) → manifest_id from a peer's announcement ``extra`` (malformed entries skipped)."""
    raw = extra.get(HELD_ARTIFACTS_KEY)
    out: dict[tuple[str, str], str] = {}
    if isinstance(raw, list):
        for item in raw[: MAX_ANNOUNCED_ARTIFACTS + MAX_ANNOUNCED_MODEL_ARTIFACTS]:
            if not (
                isinstance(item, list)
                and len(item) == 3
                and all(isinstance(x, str) for x in item)
                and _HEX64.fullmatch(item[2])
            ):
                continue
            try:
                ArtifactRequest(item[0], item[1])
            except WireError:
                continue
            out[(item[0], item[1])] = item[2]
    return out
