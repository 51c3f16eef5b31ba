"""The model cache under ``<home>/models``: verified files, partial downloads, an LRU index.

Layout::

    <home>/models/index.json          one record per cached model (atomic rewrite)
    <home>/models/<key>/<file>.gguf   a complete file whose sha256 was verified
    <home>/models/.partial/<key>.part bytes received so far (kept only when the server takes ranges)
    <home>/models/.partial/<key>.json where they came from (url, resumable, total)

``key`` is the model id when it is a plain name, else ``m-`` and 16 hex digits of its sha256. A
record's ``sha256`` is the catalogue's, or the digest of the first complete download (``pinned``);
later downloads and peer transfers of that model must match it. Eviction (:func:`plan_eviction`)
is pure: least recently used first, never a kept model, never one in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hydra_node.runtime.fetch.errors import DiskError, DownloadError

__all__ = ["CachedModel", "ModelCache", "PartialMeta", "TransferInProgress", "cache_key", "fsync_dir", "plan_eviction"]

INDEX_VERSION = 1
#: Most records the index holds (it is read whole by every command); more is a corrupt file.
MAX_INDEX_RECORDS = 4096
#: Largest index file accepted (64 KiB per ~200 records is ample).
MAX_INDEX_BYTES = 4 * 1024 * 1024

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
        return root / cache_key(self.model_id) / self.file


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


def plan_eviction(
    records: Iterable[CachedModel], limit_bytes: int, needed_bytes: int, in_use: frozenset[str]
) -> list[str] | None:
    """Model ids to delete, least recently used first, so that ``needed_bytes`` more fit under
    ``limit_bytes``; None when even deleting every evictable model is not enough."""
    records = list(records)
    used = sum(r.size_bytes for r in records)
    if used + needed_bytes <= limit_bytes:
        return []
    out: list[str] = []
    for r in sorted((r for r in records if not r.keep and r.model_id not in in_use), key=lambda r: r.last_used):
        out.append(r.model_id)
        used -= r.size_bytes
        if used + needed_bytes <= limit_bytes:
            return out
    return None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TransferInProgress(DownloadError):
    """Another process (a node, another `hydra models pull`) is writing this model's partial file."""

    code = "busy"


class ModelCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.partial_dir = root / ".partial"

    # ---- index -------------------------------------------------------------------------
    def records(self) -> dict[str, CachedModel]:
        """model id → record, for records whose file is still there (a bad index reads as empty)."""
        path = self.root / "index.json"
        try:
            if path.stat().st_size > MAX_INDEX_BYTES:
                return {}
            data = json.loads(path.read_text(encoding="utf-8"))
            raw = data["models"] if data.get("version") == INDEX_VERSION else {}
            out = {}
            for model_id, rec in list(raw.items())[:MAX_INDEX_RECORDS]:
                r = CachedModel(**rec)
                if r.model_id == model_id and r.path(self.root).is_file():
                    out[model_id] = r
            return out
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}

    def _write_index(self, records: dict[str, CachedModel]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "index.json"
        tmp = path.with_suffix(".tmp")
        body = json.dumps(
            {"version": INDEX_VERSION, "models": {k: asdict(v) for k, v in sorted(records.items())}}, indent=1
        )
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def lookup(self, model_id: str) -> CachedModel | None:
        return self.records().get(model_id)

    def pinned_sha256(self, model_id: str) -> str | None:
        rec = self.lookup(model_id)
        return rec.sha256 if rec is not None else None

    def touch(self, model_id: str, now: float) -> None:
        recs = self.records()
        if model_id in recs:
            recs[model_id] = replace(recs[model_id], last_used=now)
            self._write_index(recs)

    def set_keep(self, model_id: str, keep: bool) -> None:
        recs = self.records()
        if model_id in recs:
            recs[model_id] = replace(recs[model_id], keep=keep)
            self._write_index(recs)

    def by_sha256(self, digest: str) -> CachedModel | None:
        for rec in self.records().values():
            if rec.sha256 == digest:
                return rec
        return None

    def used_bytes(self) -> int:
        return sum(r.size_bytes for r in self.records().values())

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

    # ---- commit, remove, make room -----------------------------------------------------
    def commit(
        self, model_id: str, file: str, sha256: str, size: int, source: str, origin: str, now: float
    ) -> CachedModel:
        """Move the verified partial file into place (fsync, rename, fsync the folder), then record it."""
        part = self.partial_path(model_id)
        dest_dir = self.root / cache_key(model_id)
        try:
            with open(part, "rb+") as f:
                os.fsync(f.fileno())
            dest_dir.mkdir(parents=True, exist_ok=True)
            os.replace(part, dest_dir / file)
            fsync_dir(dest_dir)
        except OSError as exc:
            raise DiskError(f"cannot store {model_id} in {dest_dir}: {exc.strerror or exc}") from None
        self.drop_partial(model_id)
        old = self.lookup(model_id)
        rec = CachedModel(
            model_id=model_id,
            file=file,
            sha256=sha256,
            size_bytes=size,
            source=source,
            sha256_origin=origin,
            last_used=now,
            keep=old.keep if old else False,
        )
        recs = self.records()
        recs[model_id] = rec
        self._write_index(recs)
        return rec

    def remove(self, model_id: str) -> bool:
        """Delete a cached model and any partial download of it; False when there was neither."""
        recs = self.records()
        rec = recs.pop(model_id, None)
        had_partial = self.partial_path(model_id).exists()
        self.drop_partial(model_id)
        if rec is not None:
            shutil.rmtree(self.root / cache_key(model_id), ignore_errors=True)
            self._write_index(recs)
        return rec is not None or had_partial

    def make_room(self, needed_bytes: int, limit_bytes: int | None, in_use: frozenset[str]) -> list[str]:
        """Evict what :func:`plan_eviction` says and check the disk; :class:`DiskError` when it cannot fit."""
        evicted: list[str] = []
        if limit_bytes is not None:
            plan = plan_eviction(self.records().values(), limit_bytes, needed_bytes, in_use)
            if plan is None:
                raise DiskError(
                    f"the model needs {needed_bytes / 1e9:.2f} GB but the cache limit is "
                    f"{limit_bytes / 1e9:.2f} GB and the models in it are kept or in use; raise "
                    f"[models].cache_limit_gb or remove models with `hydra models rm`"
                )
            for model_id in plan:
                self.remove(model_id)
                evicted.append(model_id)
        self.root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.root).free
        if needed_bytes > free:
            raise DiskError(f"the model needs {needed_bytes / 1e9:.2f} GB; {self.root} has {free / 1e9:.2f} GB free")
        return evicted
