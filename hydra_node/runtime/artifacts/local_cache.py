"""The local artifact cache on disk: ``HOME/placement/cache`` (docs/placement.md "The local cache").

Layout::

    HOME/placement/cache/index.json        the CacheIndex (entries with their manifests, pins, model ids)
    HOME/placement/cache/KIND/NAME/PATH    an artifact's files, exactly as its manifest lists them
    HOME/placement/cache/.lock             held (flock) by every process while it reads or changes the index
    HOME/placement/cache/.partial/         model downloads and peer transfers on their way in (runtime/fetch)

The one cache of the node: placement's artifacts and the models fetched by name (``model_weights``
``sha256:HEX``, ``runtime/fetch/cache.py``) share its index, capacity and eviction.  Several
processes use it at once (the node, ``hydra-node models pull``): every method takes the lock and
re-reads the index when another process rewrote it since (:meth:`LocalCache.holding`).

A folder appears whole: stores materialise into it through a staging sibling and a rename
(``store.StagedDirectory``), and the index is rewritten atomically after it.  At load, entries
whose folder is missing are dropped and folders the index does not know (a crash between the
rename and the index write) are removed.  Plain blocking functions: the service calls them in a
worker thread.  The policy (LRU, TTL, pins, leases) is :mod:`.cache`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hydra_node.runtime.artifacts.cache import (
    MODEL_KIND,
    CacheEntry,
    CacheIndex,
    CacheKey,
    IndexCorrupt,
)
from hydra_node.runtime.artifacts.errors import ArtifactError
from hydra_node.runtime.artifacts.manifest import KINDS, Manifest
from hydra_node.runtime.artifacts.store import fsync_dir

__all__ = [
    "DISK_RESERVE_BYTES",
    "ArtifactHeld",
    "CacheFull",
    "DiskFull",
    "LocalCache",
    "cache_root",
    "manifest_of",
]

log = logging.getLogger("hydra.placement.cache")

#: Largest index file read back (4096 entries with their manifests).
MAX_INDEX_BYTES = 64 * 1024 * 1024


def cache_root(home: Path) -> Path:
    """The one cache of the node with home ``home``."""
    return home / "placement" / "cache"


class CacheFull(ArtifactError):
    """The artifact does not fit in ``[placement] cache_capacity_gb`` even after evicting every
    artifact that is neither pinned nor in use."""

    code = "cache_full"
    status = 507


class DiskFull(ArtifactError):
    """The artifact does not fit in the free space of the cache's disk (less
    :data:`DISK_RESERVE_BYTES`), even counting what evicting would free: refused before writing."""

    code = "disk_full"
    status = 507


#: Free space left on the cache's disk after any artifact is written (the node's logs, its index).
DISK_RESERVE_BYTES = 512 * 1024 * 1024


def _free_bytes(path: Path) -> int:
    """Free bytes on the file system of ``path`` (its nearest existing ancestor)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return shutil.disk_usage(path).free


def _locked(method):
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self.holding():
            return method(self, *args, **kwargs)

    return locked


class ArtifactHeld(ArtifactError):
    """An explicit evict of an artifact that is pinned or in use."""

    code = "artifact_held"
    status = 409


class LocalCache:
    def __init__(
        self, root: Path, *, capacity_bytes: int = 0, ttl_s: float = 0.0, wall: Callable[[], float] = time.time
    ) -> None:
        self.root = root
        self.index = CacheIndex(capacity_bytes=capacity_bytes, ttl_s=ttl_s)
        self._wall = wall
        self.version = 0  # bumped at every change of entries (the announcement's cache key)
        #: Held by every method that reads or changes the index: they run in worker threads at once.
        self.lock = threading.RLock()
        self._depth = 0  # holding() nesting in the thread that has the lock
        self._lock_fd: int | None = None
        self._disk: tuple[int, int, int] | None = None  # (inode, mtime ns, size) of the index we last read or wrote

    @property
    def location(self) -> str:
        return f"posix:{self.root}"

    def folder(self, kind: str, name: str) -> Path:
        return self.root / kind / name

    # ---- the lock other processes see ---------------------------------------------------------
    @contextlib.contextmanager
    def holding(self):
        """Hold the cache: this object's lock and the ``.lock`` file's ``flock`` (other processes
        wait), with the index re-read when another process changed it since we last saw it."""
        with self.lock:
            if self._depth == 0:
                self.root.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._lock_fd = fd
            self._depth += 1
            try:
                if self._depth == 1:
                    self._refresh()
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._lock_fd is not None:
                    os.close(self._lock_fd)  # releases the flock
                    self._lock_fd = None

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = (self.root / "index.json").stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        """Re-read the index another process rewrote (leases are ours: kept); a file that cannot be
        read leaves what we hold (``load`` reports it)."""
        stamp = self._stamp()
        if stamp is None or stamp == self._disk:
            return
        try:
            if stamp[2] > MAX_INDEX_BYTES:
                raise IndexCorrupt("index file too large")
            self.index.load_json(json.loads((self.root / "index.json").read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return
        self._disk = stamp
        self.version += 1

    # ---- load and save -----------------------------------------------------------------------
    @_locked
    def load(self) -> list[str]:
        """Read the index, reconcile it with the folders; lines describing what was repaired."""
        notes: list[str] = []
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "index.json"
        try:
            if path.stat().st_size > MAX_INDEX_BYTES:
                raise IndexCorrupt("index file too large")
            self.index.load_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            notes.append(f"index unreadable ({exc}); starting empty")
            self.index.entries, self.index.pins, self.index.models = {}, set(), {}
        for key in list(self.index.entries):
            if not self.folder(*key).is_dir():
                self.index.remove(key)
                notes.append(f"{key[0]}/{key[1]}: folder missing, forgotten")
        for leftover in self.root.glob(".trash-*"):  # a removal a crash interrupted
            shutil.rmtree(leftover, ignore_errors=True)
        for kind in KINDS:
            try:
                names = os.listdir(self.root / kind)
            except FileNotFoundError:
                continue
            for name in names:
                if (kind, name) not in self.index.entries:
                    shutil.rmtree(self.root / kind / name, ignore_errors=True)
                    notes.append(f"{kind}/{name}: not in the index, removed")
        self.save()
        return notes

    @_locked
    def save(self) -> None:
        self.version += 1
        path = self.root / "index.json"
        tmp = self.root / ".index.json.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.index.to_json(), f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(self.root)
        self._disk = self._stamp()

    # ---- using -------------------------------------------------------------------------------
    @_locked
    def lookup(self, kind: str, name: str, *, touch: bool = True) -> tuple[Manifest, Path] | None:
        entry = self.index.get(kind, name)
        if entry is None or (entry.kind == MODEL_KIND and entry.key in self.index.model_keys()):  # ModelCache's
            return None
        folder = self.folder(kind, name)
        if not folder.is_dir():  # removed behind our back
            self.index.remove(entry.key)
            self.save()
            return None
        if touch:
            self.index.touch(entry.key, self._wall())
            self.save()
        return manifest_of(entry), folder

    def open_artifact(self, kind: str, name: str) -> tuple[Manifest, Path] | None:
        """What a peer's ``artifact_fetch`` is sent (``peer.LocalArtifacts``): no use recorded."""
        return self.lookup(kind, name, touch=False)

    @_locked
    def acquire(self, key: CacheKey) -> None:
        """A lease: ``key`` is in use (never evicted nor expired) until :meth:`release`."""
        self.index.acquire(key)

    @_locked
    def release(self, key: CacheKey) -> None:
        self.index.release(key)

    @_locked
    def make_room(
        self, needed: int, replacing: CacheKey | None = None, *, protect: frozenset[CacheKey] = frozenset()
    ) -> list[CacheKey]:
        """Evict what :meth:`CacheIndex.plan_room` says; :class:`CacheFull` when it cannot, and
        :class:`DiskFull` (nothing evicted) when ``needed`` bytes exceed the disk's free space less
        :data:`DISK_RESERVE_BYTES`, counting what the evictions would free. ``replacing``: the
        artifact the bytes are for (named in the errors); ``protect``: entries in use by the caller."""
        what = f"{replacing[0]}/{replacing[1]} ({needed} bytes)" if replacing else f"{needed} bytes"
        plan = self.index.plan_room(needed, replacing=replacing, protect=protect)
        if plan is None:
            cap = self.index.capacity_bytes
            raise CacheFull(
                f"{what} do not fit in the cache ({cap} bytes, "
                f"{self.index.used_bytes()} used, the rest pinned or in use); raise "
                "[placement] cache_capacity_gb, unpin or evict something"
            )
        if needed > 0:
            freed = sum(self.index.entries[k].size for k in plan)
            free = _free_bytes(self.root)
            if needed > free + freed - DISK_RESERVE_BYTES:
                raise DiskFull(
                    f"{what} do not fit on the cache's disk ({self.root}: {free} bytes free, "
                    f"{freed} more after evicting, {DISK_RESERVE_BYTES} kept in reserve); free disk "
                    "space or move the node's home, and set [placement] cache_capacity_gb below the disk's size"
                )
        for key in plan:
            self._delete(key)
            log.info("event=artifact_evicted kind=%s name=%s reason=capacity", *key)
        if plan:
            self.save()
        return plan

    @_locked
    def add(self, manifest: Manifest, source: str) -> CacheEntry:
        """Record the artifact just materialised in :meth:`folder`."""
        now = self._wall()
        entry = CacheEntry(
            kind=manifest.kind,
            name=manifest.name,
            size=manifest.size,
            manifest=json.loads(manifest.to_json()),
            manifest_id=manifest.manifest_id,
            source=source,
            materialised_at=now,
            last_used=now,
        )
        self.index.add(entry)
        self.save()
        return entry

    @_locked
    def evict(self, key: CacheKey) -> bool:
        """Remove ``key`` now (an explicit evict; the caller refuses one in use)."""
        if key not in self.index.entries:
            return False
        self._delete(key)
        self.save()
        return True

    @_locked
    def sweep(self) -> list[CacheKey]:
        """Remove the artifacts whose TTL ran out (never pinned or in use)."""
        gone = self.index.expired(self._wall())
        for key in gone:
            self._delete(key)
            log.info("event=artifact_evicted kind=%s name=%s reason=ttl", *key)
        if gone:
            self.save()
        return gone

    def _delete(self, key: CacheKey) -> None:
        self.index.remove(key)
        folder = self.folder(*key)
        trash = self.root / f".trash-{key[0]}-{key[1]}-{secrets.token_hex(4)}"
        try:
            os.rename(folder, trash)  # gone at once for readers; then the bytes
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    # ---- what the API shows -------------------------------------------------------------------
    @_locked
    def pin(self, name: str, kind: str | None, on: bool) -> list[dict]:
        if on:
            self.index.pin(kind, name)
        else:
            self.index.unpin(kind, name)
        self.save()
        return [self.entry_json(e) for e in self.index.matching(name, kind)]

    @_locked
    def listing(self) -> dict:
        idx = self.index
        entries = sorted(idx.entries.values(), key=lambda e: -e.last_used)
        return {
            "root": str(self.root),
            "capacity_bytes": idx.capacity_bytes,
            "used_bytes": idx.used_bytes(),
            "ttl_s": idx.ttl_s,
            "artifacts": [self.entry_json(e) for e in entries],
            "pins": [{"kind": k, "name": n} for k, n in sorted(idx.pins, key=lambda p: (p[1], p[0] or ""))],
        }

    def entry_json(self, e: CacheEntry) -> dict:
        idx = self.index
        return {
            "kind": e.kind,
            "name": e.name,
            "size": e.size,
            "manifest_id": e.manifest_id,
            "source": e.source,
            "publisher": e.manifest.get("node"),
            "materialised_at": e.materialised_at,
            "last_used": e.last_used,
            "expires_at": idx.expires_at(e),
            "pinned": idx.pinned(e.key),
            "in_use": idx.in_use(e.key),
            "path": str(self.folder(e.kind, e.name)),
            # the model ids naming this file (``hydra-node models``), for a model fetched by name
            "models": sorted(mid for mid, a in idx.models.items() if a.key == e.key),
        }


def manifest_of(entry: CacheEntry) -> Manifest:
    return Manifest.from_json(json.dumps(dict(entry.manifest)))
