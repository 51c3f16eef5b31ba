"""Models between mesh peers over the encrypted link: ``artifact_fetch`` streams, and the retired
``model_fetch`` (``peer_wire.py``) with peers of the previous protocol generation.

* Holder: :meth:`ModelShare.serve` sends a file of our cache whose sha256 the requester names,
  from its offset. Only verified files in the cache index are offered (never an arbitrary path);
  one transfer per peer at a time and at most :data:`MAX_UPLOADS` in all, else ``busy``.
* Holder, the one stream: the same files are offered through ``artifact_fetch``
  (``runtime/artifacts/peer.py``) as the content-addressed ``model_weights`` artifacts named
  ``sha256:HEX`` (:meth:`ModelShare.artifact_share`, :class:`OfferedArtifacts`), each with a manifest this node signs, listed in
  ``extra.artifacts_held`` (:data:`MAX_ANNOUNCED_MODEL_ARTIFACTS`). ``model_fetch`` is still
  served, read-only, for the peers of the previous protocol generation (protocol/README.md 11.3).
* Requester: :meth:`ModelShare.fetch` asks the alive peers announcing the model
  (``extra.models_held``), lowest RTT first, over ``artifact_fetch`` when the peer announces the
  digest in ``artifacts_held`` and over ``model_fetch`` otherwise (an older node). Either way it
  writes into the cache's partial file, fsyncs it and records its durable length every
  :data:`DURABLE_EVERY_BYTES` and when the transfer breaks (so a broken transfer resumes at that
  offset with the next peer or the next attempt), verifies the sha256 and commits the file like a
  download.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.mesh.wire.constants import BULK_WINDOW_BYTES
from hydra_node.mesh.wire.errors import LinkClosed, MeshError, StreamReset
from hydra_node.runtime.artifacts.errors import ArtifactError
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest

# a module, its names read when used: runtime.artifacts.peer_wire imports runtime.fetch (this package)
import hydra_node.runtime.artifacts.peer_wire as artifact_wire
from hydra_node.runtime.artifacts.local_cache import LocalCache
from hydra_node.runtime.artifacts.store import Signer, check_manifest
from hydra_node.runtime.fetch.cache import CachedModel, ModelCache, PartialMeta
from hydra_node.runtime.fetch.catalogue import RemoteModel
from hydra_node.runtime.fetch.errors import DownloadError, NotInMesh, PeerFetchError
from hydra_node.runtime.fetch.http_fetch import DURABLE_EVERY_BYTES, verify_and_commit
from hydra_node.runtime.fetch.migrate import migrate_models
from hydra_node.runtime.fetch.peer_wire import (
    DISK_IO_BYTES,
    MAX_UPLOADS,
    DATA_FRAME_BYTES,
    FETCH_KIND,
    HELD_KEY,
    MAX_ANNOUNCED_MODELS,
    MAX_FETCH_FRAME_BYTES,
    FetchRequest,
    ReplyChecker,
    WireError,
    held_from_extra,
)
from hydra_node.runtime.fetch.settings import models_settings
from hydra_node.runtime.peers import PeerView, link_rtt_ms

if TYPE_CHECKING:
    from hydra_node.runtime.artifacts.peer import ArtifactShare, ArtifactShareStatistics, LocalArtifacts

__all__ = ["MAX_UPLOADS", "ModelShare", "OfferedArtifacts", "ShareStatistics"]

log = logging.getLogger("hydra.models.share")

#: The ``location`` of a cached model's manifest: the holder's model cache, whose folder (its home,
#: perhaps a user name) is not told to peers.
MODEL_CACHE_LOCATION = "posix:/model-cache"
#: Signed model manifests kept (a key per file version; more than a cache holds at once).
MAX_SIGNED_MANIFESTS = 256


@dataclass(frozen=True)
class ShareStatistics:
    """``/api/status`` ``model_share``: transfers sent and received since the start."""

    share: bool
    uploading: int
    sent_files: int
    sent_bytes: int
    refused: int
    fetched_files: int
    fetched_bytes: int
    #: Our cached models are offered through ``artifact_fetch`` too (``[models].offer_artifacts``).
    offer_artifacts: bool
    #: Of ``fetched_files``: those that came over ``artifact_fetch`` (the rest: ``model_fetch``).
    fetched_over_artifact_fetch: int
    #: Every ``artifact_fetch`` stream this node served (placement artifacts and cached models).
    artifact_fetch: ArtifactShareStatistics | None


class OfferedArtifacts:
    """What ``artifact_fetch`` serves: placement's committed artifacts, and the model cache's
    verified files as ``model_weights`` named ``sha256:HEX`` (``LocalArtifacts``)."""

    def __init__(self, placement: LocalArtifacts, share: ModelShare) -> None:
        self.placement = placement
        self.share = share

    def open_artifact(self, kind: str, name: str) -> tuple[Manifest, Path] | None:
        digest = artifact_wire.model_digest_of(kind, name)
        if digest is None:
            return self.placement.open_artifact(kind, name)
        return self.share.open_model_artifact(digest)


class ModelShare:
    def __init__(
        self,
        cache: ModelCache,
        mesh: PeerView | None,
        *,
        share: bool,
        stall_timeout_s: float,
        offer_artifacts: bool = True,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.mesh = mesh
        self.share = share
        self.offer_artifacts = offer_artifacts
        self._sign: Signer | None = None  # set by offered(): the node's key signs the model manifests
        self._manifests: dict[tuple[str, str, int, int], Manifest] = {}  # (sha256, file, size, mtime) → signed
        self._artifact_share: ArtifactShare | None = None
        self.stall_timeout_s = stall_timeout_s
        self._wall = wall
        self._uploading: set[str] = set()
        self._fetching: set[str] = set()  # model ids on their way here (one transfer writes a partial file)
        self._held: tuple[tuple[float, bool], dict] | None = None  # ((index mtime, offering), extra)
        self.sent_files = self.sent_bytes = self.refused = self.fetched_files = self.fetched_bytes = 0
        self.fetched_over_artifact_fetch = 0

    @classmethod
    def for_home(cls, home: Path, mesh: PeerView | None, file_cfg: Any, store: LocalCache) -> ModelShare:
        """The share of the models in ``store`` (the node's one cache) with the ``[models]`` settings
        of ``file_cfg``; the previous generation's ``home/models`` is moved into it first (blocking)."""
        s = models_settings(file_cfg)
        cache = ModelCache(store)
        migrate_models(home / "models", cache)
        return cls(
            cache,
            mesh,
            share=s.share,
            stall_timeout_s=s.read_timeout_s,
            offer_artifacts=s.offer_artifacts,
        )

    # ---- holder over artifact_fetch ----------------------------------------------------
    def artifact_share(self, placement: LocalArtifacts, sign: Signer) -> ArtifactShare:
        """The ``artifact_fetch`` handler of this node: placement's artifacts and our cached models,
        whose manifests ``sign`` signs (its statistics are in :meth:`status`)."""
        from hydra_node.runtime.artifacts.peer import ArtifactShare  # it imports this module

        self._sign = sign
        self._artifact_share = ArtifactShare(OfferedArtifacts(placement, self))
        return self._artifact_share

    @property
    def offering(self) -> bool:
        return self.share and self.offer_artifacts and self._sign is not None

    def open_model_artifact(self, digest: str) -> tuple[Manifest, Path] | None:
        """Blocking: the signed one-file manifest and folder of our verified file with ``digest``,
        or None (not held, not offered, or the file is not there as recorded)."""
        rec = self.cache.by_sha256(digest) if self.offering else None
        if rec is None:
            return None
        path = rec.path(self.cache.root)
        manifest = self._model_manifest(rec, path)
        return (manifest, path.parent) if manifest is not None else None

    def _model_manifest(self, rec: CachedModel, path: Path) -> Manifest | None:
        try:
            st = path.stat()
        except OSError:
            return None
        if st.st_size != rec.size_bytes:
            return None
        key = (rec.sha256, rec.file, rec.size_bytes, int(st.st_mtime))
        manifest = self._manifests.get(key)
        if manifest is None:
            assert self._sign is not None  # offering
            try:
                unsigned = Manifest(
                    "model_weights",
                    artifact_wire.model_artifact_name(rec.sha256),
                    (ArtifactFile(rec.file, rec.size_bytes, rec.sha256),),
                    {},
                    MODEL_CACHE_LOCATION,
                    max(0, int(st.st_mtime)),
                )
            except ArtifactError as exc:  # a file name a manifest cannot carry: offered over model_fetch only
                log.warning("event=model_not_offered model=%s reason=%r", rec.model_id, exc.message)
                return None
            if len(self._manifests) >= MAX_SIGNED_MANIFESTS:  # files replaced over a long life: start over
                self._manifests.clear()
            manifest = self._manifests[key] = self._sign(unsigned)
        return manifest

    # ---- announcement ------------------------------------------------------------------
    def announce_extra(self) -> dict:
        """``{"models_held": [[id, sha256], ...]}`` (the most recently used first) and, when we offer
        them through ``artifact_fetch``, ``{"artifacts_held": [["model_weights", "sha256:HEX",
        manifest id], ...]}`` for the first :data:`MAX_ANNOUNCED_MODEL_ARTIFACTS`; or {}. Kept
        unchanged until the cache index changes: a changed ``extra`` is a new announcement."""
        if not self.share:
            return {}
        try:
            mtime = (self.cache.root / "index.json").stat().st_mtime
        except OSError:
            return {}
        if self._held is None or self._held[0] != (mtime, self.offering):
            recs = sorted(self.cache.records().values(), key=lambda r: -r.last_used)[:MAX_ANNOUNCED_MODELS]
            extra: dict[str, Any] = {HELD_KEY: [[r.model_id, r.sha256] for r in recs]} if recs else {}
            if self.offering:
                offered = [m for r in recs if (m := self._model_manifest(r, r.path(self.cache.root))) is not None]
                unique = list({m.name: m for m in offered}.values())[: artifact_wire.MAX_ANNOUNCED_MODEL_ARTIFACTS]
                extra.update(artifact_wire.held_artifacts_extra(unique))
            self._held = ((mtime, self.offering), extra)
        return self._held[1]

    def status(self) -> ShareStatistics:
        return ShareStatistics(
            self.share,
            len(self._uploading),
            self.sent_files,
            self.sent_bytes,
            self.refused,
            self.fetched_files,
            self.fetched_bytes,
            self.offer_artifacts,
            self.fetched_over_artifact_fetch,
            self._artifact_share.statistics() if self._artifact_share is not None else None,
        )

    # ---- holder ------------------------------------------------------------------------
    async def serve(self, link: Any, header: Mapping[str, Any], stream: Any) -> None:
        peer = link.peer_id
        try:
            req = FetchRequest.from_header(header)
        except WireError as exc:
            await self._refuse(stream, "bad_request", str(exc))
            return
        rec = self.cache.by_sha256(req.sha256) if self.share else None
        if rec is None:
            await self._refuse(stream, "not_held", "this node does not share a file with that sha256")
            return
        if peer in self._uploading or len(self._uploading) >= MAX_UPLOADS:
            await self._refuse(stream, "busy", f"one transfer per peer, {MAX_UPLOADS} in all; try again later")
            return
        path = rec.path(self.cache.root)
        self._uploading.add(peer)
        try:
            await self._send_file(stream, path, rec, req.offset)
            self.sent_files += 1
            log.info("event=model_sent peer=%s model=%s offset=%d", peer[:16], rec.model_id, req.offset)
        except (StreamReset, LinkClosed):
            log.info("event=model_send_aborted peer=%s model=%s", peer[:16], rec.model_id)
        finally:
            self._uploading.discard(peer)

    async def _send_file(self, stream: Any, path, rec: CachedModel, offset: int) -> None:
        try:
            f = await trio.open_file(path, "rb")  # reads run in worker threads
        except OSError as exc:
            await self._refuse(stream, "read_failed", f"cannot read the file: {exc.strerror}")
            return
        async with f:
            size = os.fstat(f.fileno()).st_size
            if size != rec.size_bytes or offset > size:
                await self._refuse(
                    stream,
                    "read_failed" if size != rec.size_bytes else "bad_request",
                    "the file changed on disk" if size != rec.size_bytes else "offset past the end",
                )
                return
            await stream.send(encode_message({"op": "file", "size": size}, limit=MAX_FETCH_FRAME_BYTES))
            await f.seek(offset)
            while chunk := await f.read(DISK_IO_BYTES):
                for at in range(0, len(chunk), DATA_FRAME_BYTES):
                    block = chunk[at : at + DATA_FRAME_BYTES]
                    await stream.send(encode_message({"op": "data", "b": block}, limit=MAX_FETCH_FRAME_BYTES))
                    self.sent_bytes += len(block)
            await stream.send(encode_message({"op": "end"}, limit=MAX_FETCH_FRAME_BYTES))
            await stream.send_eof()

    async def _refuse(self, stream: Any, code: str, message: str) -> None:
        self.refused += 1
        try:
            await stream.send(
                encode_message({"op": "error", "code": code, "message": message}, limit=MAX_FETCH_FRAME_BYTES)
            )
            await stream.send_eof()
        except (StreamReset, LinkClosed):
            pass

    # ---- requester ---------------------------------------------------------------------
    def holders(self, model_id: str, sha256: str | None) -> list[tuple[str, str]]:
        """(peer id, sha256) of alive peers announcing ``model_id`` (with ``sha256`` when we know it),
        lowest RTT first."""
        if self.mesh is None:
            return []
        states = self.mesh.member_states(trio.current_time())
        found = []
        for peer_id, ann in self.mesh.members().items():
            digest = held_from_extra(dict(ann.extra)).get(model_id)
            if states.get(peer_id) != "alive" or digest is None or (sha256 is not None and digest != sha256):
                continue
            rtt = link_rtt_ms(self.mesh, peer_id)
            found.append((float("inf") if rtt is None else rtt, peer_id, digest))
        return [(pid, digest) for _, pid, digest in sorted(found)]

    async def fetch(self, remote: RemoteModel) -> CachedModel:
        """``remote`` from the first peer that sends it whole and verified; :class:`PeerFetchError`
        when no peer holds it or none could send it."""
        if remote.model_id in self._fetching:
            raise PeerFetchError(f"{remote.model_id} is being fetched already; ask again when that ends")
        self._fetching.add(remote.model_id)
        try:
            return await self._fetch_any(remote)
        finally:
            self._fetching.discard(remote.model_id)

    async def _fetch_any(self, remote: RemoteModel) -> CachedModel:
        expected = remote.sha256 or self.cache.pinned_sha256(remote.model_id)
        holders = self.holders(remote.model_id, expected)
        if not holders:
            raise NotInMesh(f"no peer in the mesh shares {remote.model_id}")
        errors = []
        for peer_id, digest in holders:
            try:
                return await self._fetch_from(peer_id, remote, digest)
            except DownloadError as exc:
                errors.append(f"{peer_id[:12]}: {exc.message}")
        raise PeerFetchError(f"no peer could send {remote.model_id}: " + "; ".join(errors)[:800])

    async def _fetch_from(self, peer_id: str, remote: RemoteModel, digest: str) -> CachedModel:
        with self.cache.partial_lock(remote.model_id):  # TransferInProgress when a download holds it
            return await self._fetch_locked(peer_id, remote, digest)

    def _offers_artifact(self, peer_id: str, digest: str) -> bool:
        """Whether ``peer_id`` announces the file ``digest`` in ``artifacts_held`` (a node of this
        protocol generation that offers its models through ``artifact_fetch``)."""
        ann = self.mesh.members().get(peer_id) if self.mesh is not None else None
        held = artifact_wire.held_artifacts_from_extra(dict(ann.extra)) if ann is not None else {}
        return ("model_weights", artifact_wire.model_artifact_name(digest)) in held

    async def _fetch_locked(self, peer_id: str, remote: RemoteModel, digest: str) -> CachedModel:
        mid = remote.model_id
        source = f"peer-sha256:{digest}"  # the same bytes whichever stream brings them: one partial file
        meta = self.cache.partial_meta(mid)
        have = self.cache.partial_bytes(mid)
        # resume only at the length recorded durable (fsynced) for this digest: a crash can leave a
        # longer, damaged tail, and bytes of another source are not these
        offset = min(have, meta.durable) if meta is not None and meta.url == source else 0
        if have and not offset:
            self.cache.drop_partial(mid)
        assert self.mesh is not None  # holders() finds peers only through the mesh
        over_artifacts = self._offers_artifact(peer_id, digest)
        if over_artifacts:
            header = artifact_wire.ArtifactRequest(
                "model_weights", artifact_wire.model_artifact_name(digest), offset
            ).header()
            reply: _Reply = _ArtifactReply(peer_id, digest, offset, remote.size_bytes)
        else:
            header = FetchRequest(digest, offset).header()
            reply = _ModelReply(offset, remote.size_bytes)
        try:
            link = await self.mesh.link_to(peer_id)
            async with link.open_stream(header) as stream:
                await stream.send_eof()  # the request is the header (see artifacts/peer.py fetch_from_peer)
                stream.grow_window(BULK_WINDOW_BYTES)  # we write as fast as it comes: let more be in flight
                await self._receive(stream, mid, source, offset, reply)
        except (MeshError, WireError, DecodeError, trio.TooSlowError) as exc:
            reason = "stalled" if isinstance(exc, trio.TooSlowError) else str(exc)
            raise PeerFetchError(f"transfer broke ({reason})", partial_kept=self.cache.partial_bytes(mid) > 0) from None
        except ArtifactError as exc:  # the holder's manifest: unsigned by it, or not this file
            raise PeerFetchError(f"refused the holder's manifest ({exc.code}): {exc.message}") from None
        # The digest is checked against what we know (catalogue, --sha256, our pin); with none, the
        # holder's announced digest is all there is: recorded as vouched for by that peer, not as
        # the catalogue's (`hydra models` shows it), and the size is checked loosely against the catalogue.
        known = remote.sha256 or self.cache.pinned_sha256(mid)
        expected = remote if known else replace(remote, sha256=digest, sha256_origin=f"peer:{peer_id}")
        rec = await trio.to_thread.run_sync(
            lambda: verify_and_commit(expected, self.cache, source=f"peer:{peer_id}", now=self._wall())
        )
        self.fetched_files += 1
        self.fetched_over_artifact_fetch += over_artifacts
        log.info(
            "event=model_fetched peer=%s model=%s bytes=%d stream=%s offset=%d",
            peer_id[:16],
            mid,
            rec.size_bytes,
            artifact_wire.ARTIFACT_FETCH_KIND if over_artifacts else FETCH_KIND,
            offset,
        )
        return rec

    async def _receive(self, stream: Any, mid: str, source: str, offset: int, reply: _Reply) -> None:
        decoder = MessageDecoder(reply.frame_limit)
        part = self.cache.partial_path(mid)
        part.parent.mkdir(parents=True, exist_ok=True)
        pending: list[bytes] = []  # received, not yet written: at most DISK_IO_BYTES + one link chunk
        held = 0
        meta: PartialMeta | None = None
        written = durable = offset
        async with await trio.open_file(part, "r+b" if offset else "wb") as f:

            async def checkpoint() -> None:  # fsync, then record the length as durable
                nonlocal durable
                await f.flush()
                await trio.to_thread.run_sync(os.fsync, f.fileno())
                if meta is not None and written > durable:
                    await trio.to_thread.run_sync(self.cache.write_partial_meta, mid, replace(meta, durable=written))
                    durable = written

            await f.truncate(offset)
            await f.seek(offset)
            try:
                while not reply.ended:
                    with trio.fail_after(self.stall_timeout_s):
                        data = await stream.receive()
                    if not data:
                        raise WireError("the holder ended the stream early")
                    decoder.receive_data(data)
                    while (msg := decoder.next_message()) is not None:
                        sized = reply.size is not None
                        block = reply.feed(msg)
                        if reply.error is not None:
                            raise PeerFetchError(f"refused ({reply.error[0]}): {reply.error[1]}")
                        if not sized and reply.size is not None:  # the holder said the size: resumable from here
                            # room in the one cache before a byte is written (DiskError: the next holder)
                            await trio.to_thread.run_sync(self.cache.make_room, reply.size - offset, frozenset())
                            meta = PartialMeta(url=source, resumable=True, total=reply.size, durable=offset)
                            self.cache.write_partial_meta(mid, meta)
                        if block:
                            pending.append(block)
                            held += len(block)
                            self.fetched_bytes += len(block)
                    if held >= DISK_IO_BYTES or reply.ended:
                        await f.write(b"".join(pending))
                        written += held
                        pending, held = [], 0
                        if written - durable >= DURABLE_EVERY_BYTES:
                            await checkpoint()
            except BaseException:
                with trio.CancelScope(shield=True):  # bounded: what we wrote, kept for the next attempt
                    try:
                        await checkpoint()
                    except OSError:
                        pass
                raise
            await checkpoint()


class _Reply(Protocol):
    """A holder's reply as the requester checks it, whichever stream: the file's size once known,
    each data frame's bytes, the holder's refusal."""

    frame_limit: int

    @property
    def ended(self) -> bool: ...

    @property
    def error(self) -> tuple[str, str] | None: ...

    @property
    def size(self) -> int | None: ...

    def feed(self, msg: Mapping[str, Any]) -> bytes: ...


class _ModelReply(ReplyChecker):
    """``model_fetch`` (the retired stream, for holders of the previous generation)."""

    frame_limit = MAX_FETCH_FRAME_BYTES


class _ArtifactReply:
    """``artifact_fetch`` of the ``model_weights`` artifact ``sha256:DIGEST``: the manifest must be
    signed by the holder itself and list exactly the one file with that digest (and the size we
    expect, when we know one); its bytes from ``offset`` follow."""

    def __init__(self, holder: str, digest: str, offset: int, expected_size: int | None) -> None:
        self.frame_limit = artifact_wire.MAX_ARTIFACT_FRAME_BYTES
        self.holder = holder
        self.digest = digest
        self.expected_size = expected_size
        self.checker = artifact_wire.ArtifactReplyChecker(offset)
        self.size: int | None = None

    @property
    def ended(self) -> bool:
        return self.checker.ended

    @property
    def error(self) -> tuple[str, str] | None:
        return self.checker.error

    def feed(self, msg: Mapping[str, Any]) -> bytes:
        had = self.checker.manifest is not None
        _, block = self.checker.feed(msg)
        manifest = self.checker.manifest
        if not had and manifest is not None:
            check_manifest(
                manifest, "model_weights", artifact_wire.model_artifact_name(self.digest), lambda n: n == self.holder
            )
            (file,) = manifest.files if len(manifest.files) == 1 else (None,)
            if file is None or file.sha256 != self.digest:
                raise WireError("the holder's manifest is not the one file with the sha256 asked for")
            if self.expected_size is not None and file.size != self.expected_size:
                raise WireError(f"the holder offers {file.size} bytes; {self.expected_size} were expected")
            self.size = file.size
        return block
