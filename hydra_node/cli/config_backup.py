"""The one rule for rewriting a config file from the CLI (``setup --force``, ``benchmark tune --apply``):
the old file is first copied to a backup that is never overwritten, then the new text replaces the
file atomically.

The first backup is ``<file>.bak``; when that exists (an earlier rewrite's), ``<file>.bak.1``,
``<file>.bak.2`` ... : the original is never lost to a second rewrite. Each backup is created
exclusively (``O_EXCL``), so two rewrites at once cannot take the same name either.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MAX_BACKUPS", "backup_path", "replace_with_backup"]

#: Most numbered backups looked for (more is a loop gone wrong: the user should prune them).
MAX_BACKUPS = 1000


def backup_path(path: Path, n: int) -> Path:
    """The ``n``-th backup name of ``path``: ``<file>.bak`` for 0, ``<file>.bak.N`` after."""
    return path.with_name(f"{path.name}.bak" + (f".{n}" if n else ""))


def _write_new(path: Path, data: bytes, mode: int) -> bool:
    """Create ``path`` holding ``data`` (fsynced); False when it exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return True


def replace_with_backup(path: Path, text: str) -> Path | None:
    """Write ``text`` to ``path`` atomically; when ``path`` existed, its old bytes are kept first in a
    new backup (returned; None when there was no file). ``OSError`` when no backup could be made
    (nothing is written then)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if path.exists():
        old, mode = path.read_bytes(), path.stat().st_mode & 0o777
        for n in range(MAX_BACKUPS):
            if _write_new(backup_path(path, n), old, mode):
                backup = backup_path(path, n)
                break
        else:
            raise OSError(f"{path}: {MAX_BACKUPS} backups exist already; delete old {path.name}.bak.* files")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return backup
