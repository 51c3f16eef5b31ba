"""What a publish reads and where it writes: a local source as artifact files, a namespace as a store.

* :func:`collect_files` — a file (one artifact file under its own name) or a folder (every regular
  file under it, by '/'-separated relative path, symbolic links refused) → ``{path: Path}``.
* :func:`open_store` — a :class:`~.settings.Namespace` → its :class:`~.store.ArtifactStore`
  (:class:`~.posix.PosixStore` or :class:`~.s3.S3Store`; boto3 is imported only for S3).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra_node.runtime.artifacts.errors import SourceInvalid, StoreUnavailable
from hydra_node.runtime.artifacts.manifest import MAX_FILES
from hydra_node.runtime.artifacts.settings import Namespace

MIB = 1024 * 1024

__all__ = ["collect_files", "open_store"]


def collect_files(source: Path) -> dict[str, Path]:
    """The files of ``source``; :class:`SourceInvalid` for a missing path, a link, an empty folder or
    more than :data:`~.manifest.MAX_FILES` files."""
    try:
        st = os.lstat(source)
    except OSError as exc:
        raise SourceInvalid(f"cannot read the source {source}: {exc.strerror}") from None
    if os.path.islink(source):
        raise SourceInvalid(f"the source {source} is a symbolic link; give the file or folder it points at")
    if not os.path.isdir(source):
        if not os.path.isfile(source):
            raise SourceInvalid(f"the source {source} is neither a regular file nor a folder")
        del st
        return {source.name: source}
    out: dict[str, Path] = {}
    for folder, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            full = Path(folder) / name
            rel = full.relative_to(source).as_posix()
            if full.is_symlink() or not full.is_file():
                raise SourceInvalid(
                    f"{full} is a symbolic link or a special file; a published folder holds regular files only"
                )
            out[rel] = full
            if len(out) > MAX_FILES:
                raise SourceInvalid(f"the source {source} holds more than {MAX_FILES} files")
    if not out:
        raise SourceInvalid(f"the source folder {source} holds no files")
    return out


def open_store(ns: Namespace, settings: Any = None) -> Any:
    """The store of ``ns`` (:class:`StoreUnavailable` when it cannot be opened); an S3 store takes
    its multipart sizes from ``settings`` (``[placement]``) when given."""
    if ns.kind == "posix":
        from hydra_node.runtime.artifacts.posix import PosixStore

        return PosixStore(Path(ns.root))
    if ns.kind == "s3":
        from hydra_node.runtime.artifacts.s3 import S3Store

        try:
            sizes: dict[str, Any] = (
                {}
                if settings is None
                else {
                    "multipart_threshold": int(settings.s3_multipart_threshold_mb * MIB),
                    "part_size": int(settings.s3_part_size_mb * MIB),
                }
            )
            return S3Store(ns.bucket, endpoint=ns.endpoint or None, region=ns.region or None, prefix=ns.prefix, **sizes)
        except ValueError as exc:
            raise StoreUnavailable(f"S3 bucket {ns.bucket}: {exc}") from None
    raise StoreUnavailable(f"unknown namespace type {ns.kind!r}")
