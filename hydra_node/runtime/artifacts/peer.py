"""Artifacts between mesh peers over the encrypted link: ``artifact_fetch`` streams (``peer_wire.py``).

* Holder: :meth:`ArtifactShare.serve` (the stream handler the root registers for
  :data:`ARTIFACT_FETCH_KIND`) sends a committed artifact of its local store: the signed manifest,
  then every file's bytes (with the request's ``offset``, the one file's bytes from there: a
  resumed transfer; an offset past the end or on several files is ``bad_request``, counted in
  ``refused_offset``). Only committed artifacts are offered, never a path; one transfer per
  peer at a time and at most :data:`MAX_UPLOADS` in all, else ``busy``. The node's handler
  serves its cached models too (``runtime/fetch/peer.py`` ``OfferedArtifacts``).
* Requester: :func:`fetch_from_peer` checks the manifest's signature (and ``trust`` of its node)
  and, through ``admit``, that its declared size fits (the cache's capacity and free disk space:
  ``LocalCache.make_room``) before taking any file byte, writes the files into a staging sibling of ``dest`` hashing them,
  refuses any file whose size or sha256 differs (:class:`ChecksumMismatch`), and renames the
  staging folder to ``dest`` only when every file verified; nothing is left otherwise.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import trio

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.mesh.wire.constants import BULK_WINDOW_BYTES
from hydra_node.mesh.wire.errors import LinkClosed, MeshError, StreamReset
from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    ArtifactNotFound,
    StoreUnavailable,
    TransferFailed,
)
from hydra_node.runtime.artifacts.filecopy import check_copy
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest
from hydra_node.runtime.artifacts.peer_wire import (
    ARTIFACT_FETCH_KIND,
    MAX_ARTIFACT_FRAME_BYTES,
    ArtifactReplyChecker,
    ArtifactRequest,
    OffsetInvalid,
    WireError,
)
from hydra_node.runtime.artifacts.store import (
    Progress,
    StagedDirectory,
    Trust,
    check_manifest,
)
from hydra_node.runtime.fetch.peer_wire import DATA_FRAME_BYTES, DISK_IO_BYTES, MAX_UPLOADS
from hydra_node.runtime.peers import PeerView

__all__ = [
    "ARTIFACT_FETCH_KIND",
    "MAX_UPLOADS",
    "STALL_TIMEOUT_S",
    "ArtifactShare",
    "ArtifactShareStatistics",
    "LocalArtifacts",
    "fetch_from_peer",
]

log = logging.getLogger("hydra.placement.peer")

#: A transfer with no frame for this long is broken (the holder stalled or the link died silently).
STALL_TIMEOUT_S = 30.0


class LocalArtifacts(Protocol):
    """What a holder shares: a committed artifact's verified manifest and the folder of its files
    (``posix.PosixStore.open_artifact``), or None."""

    def open_artifact(self, kind: str, name: str) -> tuple[Manifest, Path] | None: ...


@dataclass(frozen=True)
class ArtifactShareStatistics:
    """Transfers this node sent and refused since the start."""

    uploading: int
    sent_artifacts: int
    sent_bytes: int
    refused: int
    #: Of ``refused``: requests whose ``offset`` was malformed, past the end or on a multi-file artifact.
    refused_offset: int
    #: Transfers that resumed at an ``offset`` (the bytes before it were not sent).
    resumed: int


class ArtifactShare:
    """The holder side of ``artifact_fetch`` over ``store``."""

    def __init__(self, store: LocalArtifacts, *, max_uploads: int = MAX_UPLOADS) -> None:
        self.store = store
        self.max_uploads = max_uploads
        self._uploading: set[str] = set()
        self.sent_artifacts = self.sent_bytes = self.refused = self.refused_offset = self.resumed = 0

    def statistics(self) -> ArtifactShareStatistics:
        return ArtifactShareStatistics(
            len(self._uploading),
            self.sent_artifacts,
            self.sent_bytes,
            self.refused,
            self.refused_offset,
            self.resumed,
        )

    async def serve(self, link: Any, header: Mapping[str, Any], stream: Any) -> None:
        peer = link.peer_id
        try:
            req = ArtifactRequest.from_header(header)
        except WireError as exc:
            self.refused_offset += isinstance(exc, OffsetInvalid)
            await self._refuse(stream, "bad_request", str(exc))
            return
        try:
            found = await trio.to_thread.run_sync(self.store.open_artifact, req.kind, req.name)
        except ArtifactError as exc:
            log.warning("event=artifact_unreadable kind=%s name=%s code=%s", req.kind, req.name, exc.code)
            found = None
        if found is None:
            await self._refuse(stream, "not_held", f"this node does not share a {req.kind} named {req.name}")
            return
        if peer in self._uploading or len(self._uploading) >= self.max_uploads:
            await self._refuse(stream, "busy", f"one transfer per peer, {self.max_uploads} in all; try again later")
            return
        manifest, folder = found
        if req.offset and (len(manifest.files) != 1 or req.offset > manifest.size):
            self.refused_offset += 1
            what = "past the end" if len(manifest.files) == 1 else f"on an artifact of {len(manifest.files)} files"
            await self._refuse(
                stream,
                "bad_request",
                f"offset {req.offset} is {what}: only one file's transfer resumes, within its size",
            )
            return
        self._uploading.add(peer)
        try:
            await self._send(stream, manifest, folder, req.offset)
            log.info(
                "event=artifact_sent peer=%s kind=%s name=%s bytes=%d offset=%d",
                peer[:16],
                req.kind,
                req.name,
                manifest.size - req.offset,
                req.offset,
            )
        except (StreamReset, LinkClosed):
            log.info("event=artifact_send_aborted peer=%s kind=%s name=%s", peer[:16], req.kind, req.name)
        finally:
            self._uploading.discard(peer)

    async def _send(self, stream: Any, manifest: Manifest, folder: Path, offset: int = 0) -> None:
        await stream.send(encode_message({"op": "manifest", "m": manifest.to_cbor()}, limit=MAX_ARTIFACT_FRAME_BYTES))
        for file in manifest.files:
            try:
                f = await trio.open_file(folder / file.path, "rb")
            except OSError as exc:
                await self._refuse(stream, "read_failed", f"cannot read {file.path}: {exc.strerror}")
                return
            async with f:
                sent = offset  # nonzero only for an artifact of one file (checked in serve)
                if offset:
                    await f.seek(offset)
                while sent < file.size and (chunk := await f.read(min(DISK_IO_BYTES, file.size - sent))):
                    for at in range(0, len(chunk), DATA_FRAME_BYTES):
                        block = chunk[at : at + DATA_FRAME_BYTES]
                        await stream.send(encode_message({"op": "data", "b": block}, limit=MAX_ARTIFACT_FRAME_BYTES))
                    sent += len(chunk)
                    self.sent_bytes += len(chunk)
            if sent != file.size:
                await self._refuse(stream, "read_failed", f"{file.path} changed on disk")
                return
        await stream.send(encode_message({"op": "end"}, limit=MAX_ARTIFACT_FRAME_BYTES))
        await stream.send_eof()
        self.sent_artifacts += 1
        self.resumed += offset > 0

    async def _refuse(self, stream: Any, code: str, message: str) -> None:
        self.refused += 1
        try:
            await stream.send(
                encode_message({"op": "error", "code": code, "message": message}, limit=MAX_ARTIFACT_FRAME_BYTES)
            )
            await stream.send_eof()
        except (StreamReset, LinkClosed):
            pass


class _FileWriter:
    """The file being received: its staged copy, the sha256 of what was written, bytes held back."""

    def __init__(self, file: ArtifactFile, handle: BinaryIO) -> None:
        self.file = file
        self.handle = handle
        self.digest = hashlib.sha256()
        self.written = 0
        self.pending: list[bytes] = []
        self.held = 0

    def flush(self) -> None:
        """Blocking (run in a worker thread): write and hash what is held back."""
        data = b"".join(self.pending)
        self.pending, self.held = [], 0
        self.handle.write(data)
        self.digest.update(data)
        self.written += len(data)

    def finish(self) -> None:
        """Blocking: write the rest, fsync, close, and check size and sha256 (ChecksumMismatch)."""
        try:
            self.flush()
            self.handle.flush()
            os.fsync(self.handle.fileno())
        finally:
            self.handle.close()
        check_copy(self.file, self.written, self.digest.hexdigest())


class _StagedFiles:
    """The manifest's files written in order into the staging folder, each verified when complete."""

    def __init__(self, staging: Path, files: tuple[ArtifactFile, ...]) -> None:
        self.staging = staging
        self.files = files
        self.next = 0
        self.writer: _FileWriter | None = None

    async def write(self, file: ArtifactFile, block: bytes) -> None:
        while self.writer is None or self.writer.file is not file:
            await self._open_next()
        self.writer.pending.append(block)
        self.writer.held += len(block)
        if self.writer.held >= DISK_IO_BYTES:
            await trio.to_thread.run_sync(self.writer.flush)

    async def _open_next(self) -> None:
        await self._finish_current()
        file = self.files[self.next]  # the reply checker keeps data within the manifest's files
        self.next += 1

        def open_copy() -> BinaryIO:
            path = self.staging / file.path
            path.parent.mkdir(parents=True, exist_ok=True)
            return open(path, "xb")

        self.writer = _FileWriter(file, await trio.to_thread.run_sync(open_copy))

    async def _finish_current(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            await trio.to_thread.run_sync(writer.finish)

    async def finish(self) -> None:
        """After the end: the remaining (empty) files, and the last file verified."""
        while self.next < len(self.files):
            await self._open_next()
        await self._finish_current()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.handle.close()


_REFUSALS: dict[str, type[ArtifactError]] = {
    "not_held": ArtifactNotFound,
    "busy": StoreUnavailable,
    "read_failed": StoreUnavailable,
    "bad_request": TransferFailed,
}


async def fetch_from_peer(
    mesh: PeerView,
    peer_id: str,
    kind: str,
    name: str,
    dest: Path,
    *,
    trust: Trust | None,
    progress: Progress | None = None,
    admit: Callable[[Manifest], object] | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
) -> Manifest:
    """``kind``/``name`` from ``peer_id``'s store, materialised and verified into ``dest``.

    ``admit(manifest)`` (blocking, run in a worker thread) is called once the manifest verified
    and before anything is written: it makes room for ``manifest.size`` or raises (``CacheFull``,
    ``DiskFull``), which refuses the transfer with nothing written.

    Raises :class:`ArtifactNotFound` (the peer does not share it), :class:`SignatureInvalid`,
    :class:`ManifestInvalid`, :class:`ChecksumMismatch`, :class:`StoreUnavailable` (busy) or
    :class:`TransferFailed` (the link broke or stalled, or the peer broke the stream's rules)."""
    request = ArtifactRequest(kind, name)
    staged = StagedDirectory(Path(dest), clock=clock)
    committed = False
    try:
        link = await mesh.link_to(peer_id)
        async with link.open_stream(request.header()) as stream:
            # The request is the header: half-close now, so the holder ends the stream with its EOF
            # instead of resetting it (a reset after a slow flush would cut the transfer short).
            await stream.send_eof()
            stream.grow_window(BULK_WINDOW_BYTES)  # we write as fast as it comes: let more be in flight
            manifest = await _receive(stream, request, trust, progress, admit, stall_timeout_s, staged)
        await trio.to_thread.run_sync(staged.__exit__, None, None, None)
        committed = True
    except (MeshError, WireError, DecodeError, trio.TooSlowError) as exc:
        reason = "stalled" if isinstance(exc, trio.TooSlowError) else str(exc)
        raise TransferFailed(f"{kind}/{name} from {peer_id[:12]}: transfer broke ({reason})") from None
    finally:
        if not committed:
            with trio.CancelScope(shield=True):  # bounded: removing our own staging folder
                await trio.to_thread.run_sync(shutil.rmtree, staged.path, True)
    log.info("event=artifact_fetched peer=%s kind=%s name=%s bytes=%d", peer_id[:16], kind, name, manifest.size)
    return manifest


async def _receive(
    stream: Any,
    request: ArtifactRequest,
    trust: Trust | None,
    progress: Progress | None,
    admit: Callable[[Manifest], object] | None,
    stall_timeout_s: float,
    staged: StagedDirectory,
) -> Manifest:
    checker = ArtifactReplyChecker()
    decoder = MessageDecoder(MAX_ARTIFACT_FRAME_BYTES)
    files: _StagedFiles | None = None
    done = reported = 0
    try:
        while not checker.ended:
            with trio.fail_after(stall_timeout_s):
                data = await stream.receive()
            if not data:
                raise WireError("the holder ended the stream early")
            decoder.receive_data(data)
            while (msg := decoder.next_message()) is not None:
                file, block = checker.feed(msg)
                if checker.error is not None:
                    code, message = checker.error
                    raise _REFUSALS[code](f"{request.kind}/{request.name}: the peer refused ({code}): {message}")
                if files is None and checker.manifest is not None:
                    check_manifest(checker.manifest, request.kind, request.name, trust)  # before any file byte
                    if admit is not None:  # its declared size fits the cache and the disk, or nothing is written
                        await trio.to_thread.run_sync(admit, checker.manifest)
                    staging = await trio.to_thread.run_sync(staged.__enter__)
                    files = _StagedFiles(staging, checker.manifest.files)
                if file is not None:
                    assert files is not None  # data frames come after the manifest
                    await files.write(file, block)
                    done += len(block)
                    if progress is not None and done - reported >= DISK_IO_BYTES:
                        progress(done)
                        reported = done
        assert files is not None and checker.manifest is not None  # the end comes after the manifest
        await files.finish()
        if progress is not None:
            progress(done)
        return checker.manifest
    finally:
        if files is not None:
            files.close()
