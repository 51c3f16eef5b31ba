"""The ``artifact_fetch`` stream's messages (protocol/placement.md section 4), pure and strict.

OPEN header ``{"kind": "artifact_fetch", "artifact": KIND, "name": NAME}``. The holder answers
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

from hydra_node.runtime.artifacts.errors import ArtifactError
from hydra_node.runtime.artifacts.manifest import (
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
    "MAX_ANNOUNCED_ARTIFACTS",
    "MAX_ARTIFACT_FRAME_BYTES",
    "ArtifactReplyChecker",
    "ArtifactRequest",
    "WireError",
    "held_artifacts_extra",
    "held_artifacts_from_extra",
]

ARTIFACT_FETCH_KIND = "artifact_fetch"
#: Largest frame on the stream: the manifest frame (a data frame is 64 KiB plus its envelope).
MAX_ARTIFACT_FRAME_BYTES = MAX_MANIFEST_BYTES + 1024
#: Announcement ``extra`` key listing the artifacts a node shares: ``[[kind, name, manifest_id], ...]``.
HELD_ARTIFACTS_KEY = "artifacts_held"
#: Most artifacts one announcement lists (each costs 4 of the 256 ``extra`` items).
MAX_ANNOUNCED_ARTIFACTS = 16

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ArtifactRequest:
    kind: str
    name: str

    def __post_init__(self) -> None:
        try:
            validate_kind(self.kind)
            validate_name(self.name)
        except ArtifactError as exc:
            raise WireError(exc.message) from None

    def header(self) -> dict[str, Any]:
        return {"kind": ARTIFACT_FETCH_KIND, "artifact": self.kind, "name": self.name}

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> ArtifactRequest:
        if set(header) != {"kind", "artifact", "name"} or header.get("kind") != ARTIFACT_FETCH_KIND:
            raise WireError("an artifact_fetch header is exactly {kind, artifact, name}")
        return cls(header["artifact"], header["name"])


class ArtifactReplyChecker:
    """Checks a holder's frames in order. :meth:`feed` returns ``(file, bytes)`` for a data frame
    (``(None, b"")`` for the others); :attr:`manifest` is set by the first frame (decoded, not yet
    verified); :attr:`error` holds the holder's ``(code, message)``; anything out of place raises
    :class:`WireError` (or the manifest's :class:`ManifestInvalid`)."""

    def __init__(self) -> None:
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
            self.manifest = Manifest.from_cbor(msg["m"])
            self._left = self.manifest.files[0].size
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


def held_artifacts_from_extra(extra: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(kind, name) → manifest_id from a peer's announcement ``extra`` (malformed entries skipped)."""
    raw = extra.get(HELD_ARTIFACTS_KEY)
    out: dict[tuple[str, str], str] = {}
    if isinstance(raw, list):
        for item in raw[:MAX_ANNOUNCED_ARTIFACTS]:
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
