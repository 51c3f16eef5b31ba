"""Models between mesh peers over the encrypted link: ``model_fetch`` streams (``peer_wire.py``).

* Holder: :meth:`ModelShare.serve` sends a file of our cache whose sha256 the requester names,
  from its offset. Only verified files in the cache index are offered (never an arbitrary path);
  one transfer per peer at a time and at most :data:`MAX_UPLOADS` in all, else ``busy``.
* Requester: :meth:`ModelShare.fetch` asks the alive peers announcing the model
  (``extra.models_held``), lowest RTT first, writes into the cache's partial file (so a broken
  transfer resumes at its offset with the next peer or the next attempt), verifies the sha256 and
  commits the file like a download.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.mesh.wire.constants import BULK_WINDOW_BYTES
from hydra_node.mesh.wire.errors import LinkClosed, MeshError, StreamReset
from hydra_node.runtime.fetch.cache import CachedModel, ModelCache, PartialMeta
from hydra_node.runtime.fetch.catalogue import RemoteModel
from hydra_node.runtime.fetch.errors import DownloadError, NotInMesh, PeerFetchError
from hydra_node.runtime.fetch.http_fetch import verify_and_commit
from hydra_node.runtime.fetch.peer_wire import (
    DATA_FRAME_BYTES,
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

__all__ = ["MAX_UPLOADS", "ModelShare", "ShareStatistics"]

log = logging.getLogger("hydra.models.share")

#: Transfers this node sends at once (each to a different peer).
MAX_UPLOADS = 4
#: Bytes read from or written to disk in one worker-thread call (16 data frames): fewer thread hops.
DISK_IO_BYTES = 1 << 20


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


class ModelShare:
    def __init__(
        self,
        cache: ModelCache,
        mesh: PeerView | None,
        *,
        share: bool,
        stall_timeout_s: float,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.mesh = mesh
        self.share = share
        self.stall_timeout_s = stall_timeout_s
        self._wall = wall
        self._uploading: set[str] = set()
        self._fetching: set[str] = set()  # model ids on their way here (one transfer writes a partial file)
        self._held: tuple[float, list] | None = None  # (index mtime, announced list)
        self.sent_files = self.sent_bytes = self.refused = self.fetched_files = self.fetched_bytes = 0

    @classmethod
    def for_home(cls, home: Path, mesh: PeerView | None, file_cfg: Any) -> ModelShare:
        """The share of the cache under ``home/models`` with the ``[models]`` settings of ``file_cfg``."""
        s = models_settings(file_cfg)
        return cls(ModelCache(home / "models"), mesh, share=s.share, stall_timeout_s=s.read_timeout_s)

    # ---- announcement ------------------------------------------------------------------
    def announce_extra(self) -> dict:
        """``{"models_held": [[id, sha256], ...]}`` (the most recently used first), or {}. Kept
        unchanged until the cache index changes: a changed ``extra`` is a new announcement."""
        if not self.share:
            return {}
        try:
            mtime = (self.cache.root / "index.json").stat().st_mtime
        except OSError:
            return {}
        if self._held is None or self._held[0] != mtime:
            recs = sorted(self.cache.records().values(), key=lambda r: -r.last_used)[:MAX_ANNOUNCED_MODELS]
            self._held = (mtime, [[r.model_id, r.sha256] for r in recs])
        return {HELD_KEY: self._held[1]} if self._held[1] else {}

    def status(self) -> ShareStatistics:
        return ShareStatistics(
            self.share,
            len(self._uploading),
            self.sent_files,
            self.sent_bytes,
            self.refused,
            self.fetched_files,
            self.fetched_bytes,
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

    async def _fetch_locked(self, peer_id: str, remote: RemoteModel, digest: str) -> CachedModel:
        mid = remote.model_id
        source = f"peer-sha256:{digest}"
        meta = self.cache.partial_meta(mid)
        offset = self.cache.partial_bytes(mid)
        if offset and (meta is None or meta.url != source):
            self.cache.drop_partial(mid)
            offset = 0
        assert self.mesh is not None  # holders() finds peers only through the mesh
        try:
            link = await self.mesh.link_to(peer_id)
            async with link.open_stream(FetchRequest(digest, offset).header()) as stream:
                await stream.send_eof()  # the request is the header (see artifacts/peer.py fetch_from_peer)
                stream.grow_window(BULK_WINDOW_BYTES)  # we write as fast as it comes: let more be in flight
                await self._receive(stream, mid, source, offset, remote.size_bytes)
        except (MeshError, WireError, DecodeError, trio.TooSlowError) as exc:
            reason = "stalled" if isinstance(exc, trio.TooSlowError) else str(exc)
            raise PeerFetchError(f"transfer broke ({reason})", partial_kept=self.cache.partial_bytes(mid) > 0) from None
        # The digest is checked against what we know (catalogue, --sha256, our pin); with none, the
        # holder's announced digest is all there is: recorded as vouched for by that peer, not as
        # the catalogue's (`hydra models` shows it), and the size is checked loosely against the catalogue.
        known = remote.sha256 or self.cache.pinned_sha256(mid)
        expected = remote if known else replace(remote, sha256=digest, sha256_origin=f"peer:{peer_id}")
        rec = await trio.to_thread.run_sync(
            lambda: verify_and_commit(expected, self.cache, source=f"peer:{peer_id}", now=self._wall())
        )
        self.fetched_files += 1
        log.info("event=model_fetched peer=%s model=%s bytes=%d", peer_id[:16], mid, rec.size_bytes)
        return rec

    async def _receive(self, stream: Any, mid: str, source: str, offset: int, expected_size: int | None) -> None:
        checker = ReplyChecker(offset, expected_size)
        decoder = MessageDecoder(MAX_FETCH_FRAME_BYTES)
        part = self.cache.partial_path(mid)
        part.parent.mkdir(parents=True, exist_ok=True)
        pending: list[bytes] = []  # received, not yet written: at most DISK_IO_BYTES + one link chunk
        held = 0
        async with await trio.open_file(part, "r+b" if offset else "wb") as f:
            await f.truncate(offset)
            await f.seek(offset)
            while not checker.ended:
                with trio.fail_after(self.stall_timeout_s):
                    data = await stream.receive()
                if not data:
                    raise WireError("the holder ended the stream early")
                decoder.receive_data(data)
                while (msg := decoder.next_message()) is not None:
                    sized = checker.size is not None
                    block = checker.feed(msg)
                    if checker.error is not None:
                        raise PeerFetchError(f"refused ({checker.error[0]}): {checker.error[1]}")
                    if not sized and checker.size is not None:  # the holder said the size: resumable from here
                        self.cache.write_partial_meta(mid, PartialMeta(url=source, resumable=True, total=checker.size))
                    if block:
                        pending.append(block)
                        held += len(block)
                        self.fetched_bytes += len(block)
                if held >= DISK_IO_BYTES or checker.ended:
                    await f.write(b"".join(pending))
                    pending, held = [], 0
