"""Models fetched by name, in the node's one cache (``runtime/artifacts/local_cache.py``).

Layout (under ``<home>/placement/cache``, beside placement's artifacts)::

    index.json                              the one index: an entry per file, model id → entry
    model_weights/sha256:<hex>/<file>.gguf  a complete file whose sha256 was verified
    .partial/<key>.part                     bytes received so far (kept only when the source resumes)
    .partial/<key>.json                     where they came from (url, resumable, total, durable)

A cached model is the ``model_weights`` entry ``sha256:HEX`` (the name ``artifact_fetch`` offers it
by) plus, in the index's ``models`` table, each model id that names it and who vouches for its
digest. ``key`` (partial files) is the model id when it is a plain name, else ``m-`` and 16 hex
digits of its sha256. A record's ``sha256`` is the catalogue's, or the digest of the first complete
download (``pinned``); later downloads and peer transfers of that model must match it. ``keep``
(``pull --keep``) is the entry's pin; eviction is the cache's: least recently used first, whatever
the kind, never a pinned entry, never one in use. The layout of the previous generation
(``<home>/models``) is moved in by :mod:`.migrate`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from hydra_node.runtime.artifacts.cache import MODEL_KIND, CacheEntry, ModelAlias, model_entry_name
from hydra_node.runtime.artifacts.errors import ArtifactError
from hydra_node.runtime.artifacts.local_cache import CacheFull, DiskFull, LocalCache
from hydra_node.runtime.artifacts.manifest import ArtifactFile
from hydra_node.runtime.artifacts.store import fsync_dir  # the one directory fsync
from hydra_node.runtime.fetch.errors import DiskError, DownloadError

__all__ = ["CachedModel", "ModelCache", "PartialMeta", "TransferInProgress", "cache_key", "fsync_dir"]

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def cache_key(model_id: str) -> str:
    if _PLAIN.fullmatch(model_id) and not model_id.endswith((".part", ".json")):
        return model_id
    return "m-" + hashlib.sha256(model_id.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CachedModel:
    model_id: str
    file: str
    sha256: str
    size_bytes: int
    source: str  # the URL, or "peer:<node id>"
    #: Who vouches for ``sha256``: "catalogue", "given" (``pull --sha256``), "hub-lfs" (the Hub's LFS
    #: digest), "peer:<node id>" (a mesh member announced it), "pinned" (our own first download).
    sha256_origin: str
    last_used: float
    keep: bool = False

    def path(self, root: Path) -> Path:
        """Where the file is in the cache whose root is ``root``."""
        return root / MODEL_KIND / model_entry_name(self.sha256) / self.file


@dataclass(frozen=True)
class PartialMeta:
    url: str
    resumable: bool
    total: int | None
    #: Bytes of the partial file known to be on disk (fsynced before this was recorded): a resume
    #: starts here, never at the file's length (a crash can leave a longer, damaged tail).
    durable: int = 0
    #: The digest the source stated for the whole file (the Hub's LFS sha256), when it did.
    sha256: str | None = None


class TransferInProgress(DownloadError):
    """Another process (a node, another `hydra models pull`) is writing this model's partial file."""

    code = "busy"


#: The file name a model is stored under when its source's name is not one a manifest can carry.
FALLBACK_FILE = "model.gguf"


class ModelCache:
    """The models of the one cache: ``ModelCache(root)`` opens the cache at ``root`` (capacity
    ``capacity_bytes``, 0: none), ``ModelCache(local_cache)`` shares the node's open one."""

    def __init__(self, cache: LocalCache | Path, *, capacity_bytes: int | None = None) -> None:
        if isinstance(cache, LocalCache):
            if capacity_bytes is not None:
                raise ValueError("capacity_bytes is the LocalCache's own; set it where that is built")
            self.store = cache
        else:
            self.store = LocalCache(cache, capacity_bytes=capacity_bytes or 0)
        self.root = self.store.root
        self.partial_dir = self.root / ".partial"
        #: The files the node is serving (set by the composition root to its hosted models' paths):
        #: :meth:`make_room` never evicts the entry holding one, so a runner restart finds its file.
        self.serving_paths: Callable[[], Iterable[Path]] = tuple

    @property
    def capacity_bytes(self) -> int:
        """The one capacity (``[placement] cache_capacity_gb``; 0: no limit)."""
        return self.store.index.capacity_bytes

    # ---- index -------------------------------------------------------------------------
    def _record(self, model_id: str, alias: ModelAlias) -> CachedModel | None:
        idx = self.store.index
        entry = idx.entries.get(alias.key)
        files = entry.manifest.get("files") if entry is not None else None
        if entry is None or not isinstance(files, list) or len(files) != 1:
            return None
        f = files[0]
        if not isinstance(f, dict) or model_entry_name(str(f.get("sha256"))) != alias.name:
            return None
        return CachedModel(
            model_id=model_id,
            file=str(f["path"]),
            sha256=str(f["sha256"]),
            size_bytes=entry.size,
            source=alias.source,
            sha256_origin=alias.sha256_origin,
            last_used=entry.last_used,
            keep=idx.pinned(entry.key),
        )

    def records(self) -> dict[str, CachedModel]:
        """model id → record, for records whose file is still there."""
        with self.store.holding():
            recs = ((mid, self._record(mid, a)) for mid, a in self.store.index.models.items())
            return {mid: r for mid, r in recs if r is not None and r.path(self.root).is_file()}

    def lookup(self, model_id: str) -> CachedModel | None:
        with self.store.holding():
            alias = self.store.index.models.get(model_id)
            rec = self._record(model_id, alias) if alias is not None else None
            return rec if rec is not None and rec.path(self.root).is_file() else None

    def pinned_sha256(self, model_id: str) -> str | None:
        rec = self.lookup(model_id)
        return rec.sha256 if rec is not None else None

    def touch(self, model_id: str, now: float) -> None:
        with self.store.holding():
            alias = self.store.index.models.get(model_id)
            if alias is not None:
                self.store.index.touch(alias.key, now)
                self.store.save()

    def set_keep(self, model_id: str, keep: bool) -> None:
        """``pull --keep``: the file's entry is pinned (never evicted) or unpinned."""
        with self.store.holding():
            alias = self.store.index.models.get(model_id)
            if alias is not None:
                self.store.pin(alias.name, MODEL_KIND, keep)

    def by_sha256(self, digest: str) -> CachedModel | None:
        with self.store.holding():
            name = model_entry_name(digest)
            for mid, alias in sorted(self.store.index.models.items()):
                if alias.name == name:
                    rec = self._record(mid, alias)
                    return rec if rec is not None and rec.path(self.root).is_file() else None
            return None

    def used_bytes(self) -> int:
        """Bytes of the whole cache (models and placement's artifacts: one capacity)."""
        with self.store.holding():
            return self.store.index.used_bytes()

    # ---- partial downloads -------------------------------------------------------------
    def partial_path(self, model_id: str) -> Path:
        return self.partial_dir / f"{cache_key(model_id)}.part"

    def partial_meta(self, model_id: str) -> PartialMeta | None:
        try:
            d = json.loads((self.partial_dir / f"{cache_key(model_id)}.json").read_text(encoding="utf-8"))
            return PartialMeta(
                url=str(d["url"]),
                resumable=bool(d["resumable"]),
                total=d["total"] if isinstance(d.get("total"), int) else None,
                durable=d["durable"] if isinstance(d.get("durable"), int) and d["durable"] >= 0 else 0,
                sha256=d["sha256"] if isinstance(d.get("sha256"), str) else None,
            )
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def write_partial_meta(self, model_id: str, meta: PartialMeta) -> None:
        """Atomic (a crash leaves the old record or the new one, never half of one)."""
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        path = self.partial_dir / f"{cache_key(model_id)}.json"
        tmp = path.with_suffix(".json-tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(asdict(meta)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @contextlib.contextmanager
    def partial_lock(self, model_id: str):
        """Hold the model's partial file for one transfer (an advisory ``flock``, released when the
        process dies); :class:`TransferInProgress` if another transfer holds it."""
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.partial_dir / f"{cache_key(model_id)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise TransferInProgress(
                    f"{model_id} is being fetched by another process; try again when it ends"
                ) from None
            yield
        finally:
            os.close(fd)

    def drop_partial(self, model_id: str) -> None:
        for suffix in (".part", ".json", ".json-tmp"):
            (self.partial_dir / f"{cache_key(model_id)}{suffix}").unlink(missing_ok=True)

    def partial_bytes(self, model_id: str) -> int:
        try:
            return self.partial_path(model_id).stat().st_size
        except OSError:
            return 0

    # ---- commit, adopt, remove, make room ----------------------------------------------
    def _place(
        self, model_id: str, staged: Path, file: str, sha256: str, size: int, source: str, origin: str, now: float
    ) -> CachedModel:
        """Move the complete, fsynced file ``staged`` into the entry ``sha256:HEX`` and point
        ``model_id`` at it (holding the cache). The entry is saved before the rename: a crash
        between leaves an entry whose folder is missing (forgotten at load) and ``staged`` where it
        was, never a folder the index does not know (which ``LocalCache.load`` removes)."""
        name = model_entry_name(sha256)
        key = (MODEL_KIND, name)
        with self.store.holding():
            idx = self.store.index
            old = idx.models.get(model_id)
            here = self.by_sha256(sha256)
            if here is not None and here.size_bytes == size:  # the same bytes are here already
                staged.unlink(missing_ok=True)
                idx.touch(key, now)
                file = here.file
            else:
                if key in idx.entries:
                    self.store.evict(key)  # a record without its file: replaced
                try:
                    ArtifactFile(file, size, sha256)
                except ArtifactError:
                    file = FALLBACK_FILE
                manifest = {"kind": MODEL_KIND, "name": name, "files": [{"path": file, "sha256": sha256, "size": size}]}
                idx.add(CacheEntry(MODEL_KIND, name, size, manifest, "", source, now, now))
                idx.models[model_id] = ModelAlias(name, origin, source)
                self.store.save()
                folder = self.store.folder(*key)
                folder.mkdir(parents=True, exist_ok=True)
                os.replace(staged, folder / file)
                fsync_dir(folder)
            idx.models[model_id] = ModelAlias(name, origin, source)
            if old is not None and old.key != key and old.key not in idx.model_keys():
                self.store.evict(old.key)  # its last model id now names other bytes
            self.store.save()
            rec = self._record(model_id, idx.models[model_id])
        assert rec is not None
        return rec

    def commit(
        self, model_id: str, file: str, sha256: str, size: int, source: str, origin: str, now: float
    ) -> CachedModel:
        """Move the verified partial file into place (fsync, rename, fsync the folder), then record it."""
        part = self.partial_path(model_id)
        try:
            with open(part, "rb+") as f:
                os.fsync(f.fileno())
            rec = self._place(model_id, part, file, sha256, size, source, origin, now)
        except OSError as exc:
            raise DiskError(f"cannot store {model_id} in {self.root}: {exc.strerror or exc}") from None
        self.drop_partial(model_id)
        return rec

    def adopt(
        self,
        model_id: str,
        staged: Path,
        *,
        file: str,
        sha256: str,
        size: int,
        source: str,
        origin: str,
        last_used: float,
        keep: bool,
    ) -> CachedModel:
        """Take in a verified file of the previous layout (:mod:`.migrate`): ``staged`` is renamed into
        the cache (it must be on the cache's file system), keeping its record's use time and keep."""
        rec = self._place(model_id, staged, file, sha256, size, source, origin, last_used)
        if keep:
            self.set_keep(model_id, True)
        return self.lookup(model_id) or rec

    def remove(self, model_id: str) -> bool:
        """Delete a cached model (its file too, when no other model id names it; and its keep) and
        any partial download of it; False when there was neither."""
        had_partial = self.partial_path(model_id).exists()
        self.drop_partial(model_id)
        with self.store.holding():
            idx = self.store.index
            alias = idx.models.pop(model_id, None)
            if alias is None:
                return had_partial
            if alias.key not in idx.model_keys():
                idx.unpin(MODEL_KIND, alias.name)
                self.store.evict(alias.key)
            self.store.save()
            return True

    def make_room(self, needed_bytes: int, in_use: frozenset[str]) -> list[str]:
        """Evict what the one cache's policy says (least recently used first, whatever the kind;
        never a pinned or kept entry, one in use, nor the files of ``in_use`` model ids) and check
        the disk; the ``kind/name`` evicted. :class:`DiskError` when it cannot fit."""
        with self.store.holding():
            idx = self.store.index
            protect = frozenset(a.key for mid, a in idx.models.items() if mid in in_use)
            root = self.root.resolve()
            for p in self.serving_paths():  # root/KIND/NAME/FILE: the entry (KIND, NAME) holds it
                folder = Path(p).resolve().parent
                if folder.parent.parent == root and (folder.parent.name, folder.name) in idx.entries:
                    protect |= {(folder.parent.name, folder.name)}
            try:
                evicted = self.store.make_room(needed_bytes, protect=protect)
            except CacheFull:
                raise DiskError(
                    f"the model needs {needed_bytes / 1e9:.2f} GB but the cache's capacity is "
                    f"{idx.capacity_bytes / 1e9:.2f} GB and what it holds is kept, pinned or in use; raise "
                    f"[placement] cache_capacity_gb, or remove models with `hydra models rm`"
                ) from None
            except DiskFull as exc:
                raise DiskError(exc.message) from None
        return [f"{k}/{n}" for k, n in evicted]
