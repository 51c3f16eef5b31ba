"""The model cache of the previous generation (``<home>/models``) moved into the one cache.

The old layout::

    <home>/models/index.json          {"version": 1, "models": {id: record}}
    <home>/models/<key>/<file>        a verified file
    <home>/models/.partial/<key>.*    downloads on their way in

:func:`migrate_models` moves every verified file (its record in the old index, its size as
recorded) into the one cache (:meth:`ModelCache.adopt`): a rename on the same file system, else a
copy into the cache's ``.partial/`` (fsynced) and then a rename, so no half file is ever visible
in the cache. Partial downloads move to the cache's ``.partial/`` and resume there.

Crash-safe without a journal of its own: the old ``index.json`` is the marker. It is removed only
once every file it lists is in the cache, so a migration killed midway runs again at the next
start and skips what is already moved (a file in the cache with the record's digest and size).
The cache records each entry before renaming its file in (``ModelCache._place``), so
``LocalCache.load``, which removes folders its index does not know, never sees a moved file
without its entry. Blocking; ``hydra-node serve`` and ``hydra-node models`` run it on opening the
cache (docs/models.md "The cache").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from hydra_node.runtime.artifacts.cache import MAX_ENTRIES
from hydra_node.runtime.fetch.cache import ModelCache, cache_key, fsync_dir

__all__ = ["MAX_OLD_INDEX_BYTES", "migrate_models"]

log = logging.getLogger("hydra.models.migrate")

#: Largest old index read (it held at most 4096 records).
MAX_OLD_INDEX_BYTES = 4 * 1024 * 1024
_RECORD_KEYS = ("model_id", "file", "sha256", "size_bytes", "source", "sha256_origin", "last_used")


def _old_records(index: Path) -> dict[str, dict] | None:
    try:
        if index.stat().st_size > MAX_OLD_INDEX_BYTES:
            return None
        data = json.loads(index.read_text(encoding="utf-8"))
        # the one cache's own index has "entries" (and a "models" table of another shape)
        models = data["models"] if data.get("version") == 1 and "entries" not in data else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return models if isinstance(models, dict) else None


def _valid(model_id: str, rec: object) -> bool:
    return (
        isinstance(rec, dict)
        and all(k in rec for k in _RECORD_KEYS)
        and rec["model_id"] == model_id
        and isinstance(rec["file"], str)
        and "/" not in rec["file"]
        and isinstance(rec["sha256"], str)
        and isinstance(rec["size_bytes"], int)
        and isinstance(rec["last_used"], (int, float))
    )


def _stage(src: Path, cache: ModelCache, sha256: str) -> Path:
    """``src`` on the cache's file system: itself, or a complete fsynced copy in ``.partial/``."""
    cache.partial_dir.mkdir(parents=True, exist_ok=True)
    if src.stat().st_dev == cache.partial_dir.stat().st_dev:
        return src
    tmp = cache.partial_dir / f"migrate-{sha256[:16]}.tmp"
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, 8 << 20)
        fout.flush()
        os.fsync(fout.fileno())
    return tmp


def migrate_models(old_root: Path, cache: ModelCache) -> list[str]:
    """Move the models of ``old_root`` (the previous layout) into ``cache``; one line per thing
    done or left (logged too). Nothing to do without ``old_root/index.json``."""
    index = old_root / "index.json"
    if not index.is_file():
        return []
    records = _old_records(index)
    if records is None:
        note = f"{index}: not an index this code wrote; left in place (move the files with `hydra models pull`)"
        log.warning("event=model_cache_migration_skipped reason=%r", note)
        return [note]
    notes: list[str] = []
    complete = True
    for model_id, rec in list(records.items())[:MAX_ENTRIES]:  # the old index held at most as many
        if not _valid(model_id, rec):
            complete = False  # the index stays for the operator to look at
            notes.append(f"{model_id!r:.80}: a malformed record, not moved")
            continue
        sha256, size = rec["sha256"], rec["size_bytes"]
        src = old_root / cache_key(model_id) / rec["file"]
        held = cache.by_sha256(sha256)
        if held is not None and held.size_bytes == size and cache.lookup(model_id) is not None:
            if rec.get("keep"):  # moved by a migration that was stopped later on (perhaps before this)
                cache.set_keep(model_id, True)
            continue
        try:
            if held is None or held.size_bytes != size:
                if not src.is_file() or src.stat().st_size != size:
                    notes.append(f"{model_id}: {src} is missing or not its recorded size; not moved")
                    continue
                staged = _stage(src, cache, sha256)
            else:
                staged = src  # the same bytes are in the cache under another id: this copy is dropped
            cache.adopt(
                model_id,
                staged,
                file=rec["file"],
                sha256=sha256,
                size=size,
                source=str(rec["source"]),
                origin=str(rec["sha256_origin"]),
                last_used=float(rec["last_used"]),
                keep=bool(rec.get("keep", False)),
            )
            src.unlink(missing_ok=True)  # after a copy: the original
            notes.append(f"{model_id}: moved into {cache.root}")
        except OSError as exc:
            complete = False
            notes.append(f"{model_id}: not moved ({exc.strerror or exc}); tried again at the next start")
    _move_partials(old_root, cache)
    for line in notes:
        log.info("event=model_cache_migrated note=%r", line)
    if complete:
        index.unlink()
        fsync_dir(old_root)
        for child in old_root.iterdir():  # the emptied model folders (a file not moved stays)
            if child.is_dir():
                _remove_empty(child)
        log.info("event=model_cache_migration_done old=%s cache=%s", old_root, cache.root)
    return notes


def _move_partials(old_root: Path, cache: ModelCache) -> None:
    partial = old_root / ".partial"
    if not partial.is_dir():
        return
    cache.partial_dir.mkdir(parents=True, exist_ok=True)
    for p in sorted(partial.iterdir()):
        if p.suffix not in (".part", ".json") or (cache.partial_dir / p.name).exists():
            continue
        try:
            os.replace(p, cache.partial_dir / p.name)  # the same file system: else it starts over
        except OSError:
            continue


def _remove_empty(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_file() and p.suffix == ".lock":
            p.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass  # something we did not move is still there: left for the operator
